"""Block swapping and low-precision base weights on tiny diffusers models (Wan; Flux, two block lists; the
newer families Qwen-Image and Z-Image over NF4 bases, FLUX.2 and HunyuanVideo 1.5 over FP8 ones):
with LoRA on the families' usual layers, swapping every block gives the loss and every adapter
gradient of the unswapped model, with diffusers-style blocks (keyword arguments, tuple outputs, two
block lists), with our activation checkpointing or diffusers' own, and on top of FP8 storage; the
copies per step are counted."""

import pytest
import torch

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.memory import apply_base_precision, apply_block_swap
from opendit_lite.models.blocks import find_blocks
from opendit_lite.models.lora import apply_lora
from tests import diffusers_families as families


def adapted(name: str, precision: str = "none"):
    model = families.build(name)
    apply_lora(model, rank=2, alpha=4.0, dropout=0.0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    apply_base_precision(model, precision)
    return model


def gradients(model, inputs):
    model.zero_grad()
    loss = families.loss(model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name,checkpoint", [("WanTransformer3DModel", "none"), ("WanTransformer3DModel", "diffusers"),
                                             ("FluxTransformer2DModel", "none"), ("FluxTransformer2DModel", "ours")])
def test_swapping_every_block_is_exact(name, checkpoint):
    inputs = families.forward_inputs(name)
    reference, model = adapted(name), adapted(name)
    blocks = len(find_blocks(model))
    report = apply_block_swap(model, blocks)
    for m in (reference, model):
        if checkpoint == "ours":
            apply_activation_checkpointing(m, 0.0)
        elif checkpoint == "diffusers":
            m.enable_gradient_checkpointing()
    ref_loss, ref_grads = gradients(reference, inputs)
    report.swapper.counts.reset()
    loss, grads = gradients(model, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    assert grads.keys() == ref_grads.keys() and all(".lora_" in n for n in grads)
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=0, atol=0, msg=n)
    counts = report.swapper.counts
    assert counts.fetches == 2 * blocks and counts.stores == 0
    assert counts.order == [(i, "forward") for i in range(blocks)] + [(i, "backward") for i in reversed(range(blocks))]


def test_swapping_fp8_storage_is_exact(name="WanTransformer3DModel"):
    inputs = families.forward_inputs(name)
    reference, model = adapted(name, "fp8"), adapted(name, "fp8")
    report = apply_block_swap(model, 1)
    hosts = [s.host for b in report.swapper.blocks for s in b.slots]
    assert any(h.dtype == torch.float8_e4m3fn for h in hosts)  # the host holds the FP8 copies
    ref_loss, ref_grads = gradients(reference, inputs)
    loss, grads = gradients(model, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=0, atol=0, msg=n)
    assert report.swapper.counts.fetches == 2


# The families added after the first six, each over one low-precision base (both formats covered twice; the
# formats' layer is the same for every family, tests/memory/test_low_precision.py): every block swapped.
NEWER = (("QwenImageTransformer2DModel", "nf4"), ("ZImageTransformer2DModel", "nf4"),
         ("Flux2Transformer2DModel", "fp8"), ("HunyuanVideo15Transformer3DModel", "fp8"))


@pytest.mark.parametrize("name,precision", NEWER)
def test_swapping_every_block_over_a_low_precision_base_is_exact(name, precision):
    """With the frozen base stored in FP8 or NF4: the swapped model's loss and adapter gradients equal the
    unswapped one's of the same storage, and the adapters get gradients."""
    inputs = families.forward_inputs(name)
    reference, model = adapted(name, precision), adapted(name, precision)
    blocks = len(find_blocks(model))
    report = apply_block_swap(model, blocks)
    ref_loss, ref_grads = gradients(reference, inputs)
    loss, grads = gradients(model, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert grads.keys() == ref_grads.keys() and grads.keys() <= trainable and all(".lora_" in n for n in grads)
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=0, atol=0, msg=n)
    assert any(g.abs().max() > 0 for n, g in grads.items() if ".lora_A." in n)
    assert report.swapper.counts.fetches == 2 * blocks
