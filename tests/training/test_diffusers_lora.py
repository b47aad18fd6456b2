"""LoRA on the diffusers families: with no targets given, the adapters go on the layers diffusers'
LoRA scripts adapt (attention projections, the text stream's, the feed-forward), declared per
family; LoRA composes with fused AdaLN and selective checkpointing with offload (parallelize applies
it first) to the same loss and adapter gradients as LoRA alone; the merged export of a trained
adapter equals the adapted model."""

import copy

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from opendit_lite.builders.lora_checkpoint import export_merged
from opendit_lite.checkpoint.weights import load_weights
from opendit_lite.models.lora import apply_lora, lora_target_names
from opendit_lite.parallelization import parallelize
from tests import diffusers_families as families

RANK, ALPHA = 2, 4.0

# family -> (adapted linear layers in the tiny config, layers that must be among them, layers that must not)
TARGETS = {
    "WanTransformer3DModel": (20, ["blocks.0.attn1.to_q", "blocks.1.attn2.to_out.0", "blocks.0.ffn.net.0.proj",
                                   "blocks.0.ffn.net.2"], ["proj_out", "condition_embedder.time_proj"]),
    "FluxTransformer2DModel": (17, ["transformer_blocks.0.attn.add_k_proj", "transformer_blocks.0.attn.to_add_out",
                                    "transformer_blocks.0.ff_context.net.2", "single_transformer_blocks.0.proj_mlp",
                                    "single_transformer_blocks.0.proj_out", "single_transformer_blocks.0.attn.to_v"],
                               ["proj_out", "norm_out.linear", "transformer_blocks.0.norm1.linear"]),
    "SD3Transformer2DModel": (21, ["transformer_blocks.1.attn.to_out.0", "transformer_blocks.0.ff.net.0.proj",
                                   "transformer_blocks.0.ff_context.net.2"], ["proj_out", "context_embedder"]),
    "CogVideoXTransformer3DModel": (12, ["transformer_blocks.0.attn1.to_k", "transformer_blocks.1.ff.net.2"],
                                    ["transformer_blocks.0.norm1.linear", "proj_out"]),
    "HunyuanVideoTransformer3DModel": (23, ["transformer_blocks.0.attn.add_q_proj",
                                            "single_transformer_blocks.0.proj_out",
                                            "context_embedder.token_refiner.refiner_blocks.0.attn.to_q"],
                                       ["proj_out", "single_transformer_blocks.0.norm.linear"]),
    "LTXVideoTransformer3DModel": (20, ["transformer_blocks.0.attn2.to_v", "transformer_blocks.1.ff.net.0.proj"],
                                   ["proj_out", "proj_in"]),
    "QwenImageTransformer2DModel": (16, ["transformer_blocks.0.attn.add_k_proj", "transformer_blocks.1.attn.to_out.0",
                                         "transformer_blocks.0.img_mlp.net.2", "transformer_blocks.1.attn.add_v_proj"],
                                    ["proj_out", "img_in", "txt_in", "transformer_blocks.1.attn.to_add_out",
                                     "transformer_blocks.1.txt_mlp.net.2", "transformer_blocks.1.attn.add_q_proj"]),
    "ZImageTransformer2DModel": (14, ["layers.0.attention.to_q", "layers.1.feed_forward.w2",
                                      "layers.1.attention.to_out.0"],
                                 ["all_final_layer.2-1.linear", "layers.0.adaLN_modulation.0", "cap_embedder.1"]),
    "Flux2Transformer2DModel": (14, ["transformer_blocks.0.attn.add_v_proj", "transformer_blocks.0.ff.linear_in",
                                     "transformer_blocks.0.ff_context.linear_out",
                                     "single_transformer_blocks.0.attn.to_qkv_mlp_proj",
                                     "single_transformer_blocks.0.attn.to_out"],
                                ["proj_out", "x_embedder", "single_stream_modulation.linear", "norm_out.linear"]),
    # not the text stream's output projection and feed-forward (the last block's are in no step's graph)
    "HunyuanVideo15Transformer3DModel": (24, ["transformer_blocks.1.attn.add_q_proj", "transformer_blocks.0.ff.net.2",
                                              "context_embedder.token_refiner.refiner_blocks.0.attn.to_q"],
                                         ["proj_out", "transformer_blocks.1.attn.to_add_out",
                                          "transformer_blocks.0.ff_context.net.2", "context_embedder_2.linear_1"]),
}
# The families whose blocks' norms no fused kernel takes (their fused_norms.py says why).
NOTHING_FUSED = ("LTXVideoTransformer3DModel", "ZImageTransformer2DModel")


@pytest.mark.parametrize("name", families.FAMILIES)
def test_default_targets_are_the_familys_usual_layers(name):
    count, present, absent = TARGETS[name]
    model = families.build(name)
    report = apply_lora(model, rank=RANK, alpha=ALPHA, dropout=0.0, targets=None)
    adapted = set(lora_target_names(families.build(name), report.targets))
    assert report.layers == len(adapted) == count
    assert set(present) <= adapted and not set(absent) & adapted
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)


def adapter_gradients(model, inputs):
    loss = families.loss(model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", families.FAMILIES)
def test_lora_composes_with_fused_adaln_and_checkpointing(name):
    inputs = families.forward_inputs(name)
    reference = families.build(name)
    apply_lora(reference, rank=RANK, alpha=ALPHA, dropout=0.0, targets=None)
    ref_loss, ref_grads = adapter_gradients(families.randomize_adapters(reference), inputs)

    model = families.build(name)
    report = parallelize(model, lora_rank=RANK, lora_alpha=ALPHA, fused_adaln=name not in NOTHING_FUSED,
                         selective_ratio=0.5, ac_offload=True)
    assert report.count("lora") == TARGETS[name][0] and report.count("activation_checkpointing") == 1
    loss, grads = adapter_gradients(families.randomize_adapters(model), inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and any(".lora_A." in n for n in grads)
    for key in grads:
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.parametrize("name", ["FluxTransformer2DModel", "CogVideoXTransformer3DModel"])
def test_merged_export_equals_the_adapted_model(name, tmp_path):
    """A checkpoint of the adapted model (base under base_layer, adapters) exports merged weights
    with diffusers' own keys, which a plain model of the family loads and runs identically."""
    inputs = families.forward_inputs(name)
    adapted = families.build(name)
    apply_lora(adapted, rank=RANK, alpha=ALPHA, dropout=0.0, targets=None)
    families.randomize_adapters(adapted)
    checkpoint = str(tmp_path / "adapted.safetensors")
    save_file({k: v.contiguous() for k, v in adapted.state_dict().items()}, checkpoint)

    merged_file = export_merged(families.build(name, seed=7), checkpoint, str(tmp_path / "merged.safetensors"),
                                use_ema=False, lora=dict(rank=RANK, alpha=ALPHA, dropout=0.0, targets=None))
    plain = families.build(name, seed=9)
    load_weights(plain, merged_file)
    assert plain.state_dict().keys() == families.build(name).state_dict().keys()
    assert all(isinstance(plain.get_submodule(n), nn.Linear) for n in lora_target_names(plain, TARGETS[name][1]))
    with torch.no_grad():
        torch.testing.assert_close(families.output(plain, inputs), families.output(adapted, inputs),
                                   rtol=1e-5, atol=1e-5)
        assert (families.output(plain, inputs) - families.output(families.build(name), inputs)).abs().max() > 1e-3


def test_explicit_targets_still_win():
    model = families.build("WanTransformer3DModel")
    report = apply_lora(copy.deepcopy(model), rank=RANK, alpha=ALPHA, dropout=0.0, targets=["attn1.to_q"])
    assert report.layers == 2 and report.targets == ("attn1.to_q",)


def test_everything_in_parallelize_composes_with_per_block_compile():
    """LoRA, fused AdaLN, selective checkpointing with offload and per-block compile (the eager
    backend: dynamo traces the converted blocks) give LoRA alone's loss and adapter gradients."""
    name = "FluxTransformer2DModel"
    inputs = families.forward_inputs(name)
    reference = families.build(name)
    apply_lora(reference, rank=RANK, alpha=ALPHA, dropout=0.0, targets=None)
    ref_loss, ref_grads = adapter_gradients(families.randomize_adapters(reference), inputs)
    model = families.build(name)
    parallelize(model, lora_rank=RANK, lora_alpha=ALPHA, fused_adaln=True, selective_ratio=0.5, ac_offload=True,
                compile=True, compile_backend="eager")
    torch._dynamo.reset()
    loss, grads = adapter_gradients(families.randomize_adapters(model), inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for key in grads:
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-4, atol=1e-6, msg=key)
