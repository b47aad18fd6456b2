"""One training step of each diffusers family through ``parallelize`` + ``OpenDiTPlugin`` with
everything on (fused AdaLN, selective checkpointing with offload, the sharded EMA; full training
and LoRA) under DDP, ZeRO-1 and ZeRO-2, against the plain model stepped by torch's AdamW with an
EMA computed here: every parameter and every EMA value equal within fp32 rounding.

One spawned process runs every family and strategy (a world of one: the plugin, the ZeRO
optimizer and the collectives are the real ones); a second spawn of 2 ranks runs one family
(Flux: joint attention, two block lists) data-parallel, each rank on its half of the batch, and
saves a checkpoint whose merged LoRA export (with the EMA) equals the adapted model. The block
inputs are offloaded through a host-copy stand-in for the CUDA copier (as in
tests/activation_checkpointing/test_offload.py), so the offload path really runs.
"""

import functools
import os
import tempfile

import pytest
import torch

from tests import diffusers_families as families
from tests.distributed import run_distributed

LR, DECAY, RANK, ALPHA = 1e-2, 0.5, 2, 4.0
# Adam's first step is lr * g / (|g| + eps): with the default eps a gradient that is zero up to
# rounding (a key norm's bias, which softmax cancels) moves by up to lr in a direction set by the
# rounding, and a difference in g is amplified by up to lr / eps. eps = 1e-3 keeps that to 10x, so
# the comparison measures the kernels' rounding, not Adam's sign of noise.
ADAM_EPS = 1e-3
STRATEGIES = {"ddp": 0, "zero1": 1, "zero2": 2}
# fp32 throughout: what remains is summation order (ZeRO's flat buffers, a 2-rank gradient average).
TOLERANCE = 2e-6


def target_for(name: str, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        shape = families.output(families.build(name), inputs).shape
    return torch.randn(shape, generator=torch.Generator().manual_seed(11))


def build(name: str, lora: bool, transform: bool):
    """The tiny model; with ``transform``, through parallelize with everything on (the adapters
    first, as parallelize orders them), else LoRA alone (or nothing)."""
    from opendit_lite.models.lora import apply_lora
    from opendit_lite.parallelization import parallelize

    model = families.build(name)
    if transform:
        parallelize(model, fused_adaln=name != "LTXVideoTransformer3DModel", selective_ratio=0.5, ac_offload=True,
                    lora_rank=RANK if lora else 0, lora_alpha=ALPHA)
    elif lora:
        apply_lora(model, rank=RANK, alpha=ALPHA, dropout=0.0, targets=None)
    return families.randomize_adapters(model) if lora else model


def reference_step(name: str, lora: bool):
    """The plain model, torch's AdamW on the whole batch, and the EMA of the trainable weights."""
    inputs = families.forward_inputs(name)
    model = build(name, lora, transform=False)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    ema = {n: p.detach().clone() for n, p in trainable.items()}
    optimizer = torch.optim.AdamW(trainable.values(), lr=LR, weight_decay=0.0, eps=ADAM_EPS)
    families.loss(model, inputs, target_for(name, inputs)).backward()
    optimizer.step()
    ema = {n: DECAY * ema[n] + (1 - DECAY) * p.detach() for n, p in trainable.items()}
    return {n: p.detach().clone() for n, p in model.named_parameters()}, ema


def plugin_step(name: str, zero_degree: int, lora: bool, checkpoint_dir=None):
    """The transformed model boosted by the plugin, one step on this rank's share of the batch."""
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin

    plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="fp32")
    booster = Booster(plugin=plugin)
    model = build(name, lora, transform=True)
    optimizer = plugin.build_optimizer([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0,
                                       eps=ADAM_EPS)
    model, optimizer, *_ = booster.boost(model, optimizer)
    plugin.create_ema(model)
    inputs = families.forward_inputs(name)
    share = 2 // plugin.dp_size
    target = target_for(name, inputs)[plugin.dp_rank * share:(plugin.dp_rank + 1) * share]
    local = families.batch_slice(inputs, plugin.dp_rank * share, (plugin.dp_rank + 1) * share)
    booster.backward(families.loss(model, local, target), optimizer)
    optimizer.step()
    optimizer.zero_grad()
    plugin.update_ema(model, decay=DECAY)
    out = dict(params={n: p.detach().clone() for n, p in model.unwrap().named_parameters()},
               ema=plugin.ema.state_dict())
    if checkpoint_dir is not None:
        from opendit_lite.checkpoint.save_restore import save_checkpoint

        out["checkpoint"] = save_checkpoint(booster, checkpoint_dir, 1, model, optimizer, ema=plugin.ema)
    return out


def _install_offload_copier():
    from opendit_lite.activation_checkpointing import offload as offload_module
    from tests.activation_checkpointing.test_offload import RecordingCopier

    copier = RecordingCopier()
    offload_module._copier_for_device = lambda device: copier
    return copier


def _one_process(rank, world_size):
    from tests.zero_cpu_shim import install as install_zero_cpu_shim

    install_zero_cpu_shim()
    copier = _install_offload_copier()
    results = {}
    for name in families.FAMILIES:
        for strategy, zero_degree in STRATEGIES.items():
            for lora in (False, True):
                results[(name, strategy, lora)] = plugin_step(name, zero_degree, lora)
    results["offloaded"] = sum(event[0] == "out" for event in copier.log)
    return results


def _two_ranks(rank, world_size, checkpoint_dir):
    from tests.zero_cpu_shim import install as install_zero_cpu_shim

    install_zero_cpu_shim()
    _install_offload_copier()
    name = "FluxTransformer2DModel"
    return {("zero2", False): plugin_step(name, 2, False),
            ("zero1", True): plugin_step(name, 1, True, checkpoint_dir=checkpoint_dir)}


@functools.lru_cache(maxsize=None)
def one_process():
    return run_distributed(_one_process, world_size=1)[0]


def max_diff(a, b):
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("name", families.FAMILIES)
def test_one_step_through_the_plugin_equals_the_plain_step(name, lora):
    results = one_process()
    ref_params, ref_ema = reference_step(name, lora)
    for strategy in STRATEGIES:
        got = results[(name, strategy, lora)]
        assert max_diff(got["params"], ref_params) < TOLERANCE, (name, strategy)
        assert max_diff({k: got["ema"][k] for k in ref_ema}, ref_ema) < TOLERANCE, (name, strategy)
        moved = max((got["params"][k] - v).abs().max().item() for k, v in families.build(name).state_dict().items()
                    if k in got["params"])
        assert lora or moved > 1e-4, "the step changed nothing: the comparison would not bite"
    assert results["offloaded"] > 0, "no block input went through the offload copier"


@pytest.mark.slow
def test_two_data_parallel_ranks_and_the_merged_export():
    from opendit_lite.builders.lora_checkpoint import export_merged
    from opendit_lite.checkpoint.weights import load_weights

    name = "FluxTransformer2DModel"
    with tempfile.TemporaryDirectory() as root:
        ranks = run_distributed(_two_ranks, world_size=2, args=(root,))
        for lora, key in ((False, ("zero2", False)), (True, ("zero1", True))):
            ref_params, ref_ema = reference_step(name, lora)
            for got in (ranks[0][key], ranks[1][key]):
                assert max_diff(got["params"], ref_params) < TOLERANCE, key
                assert max_diff({k: got["ema"][k] for k in ref_ema}, ref_ema) < TOLERANCE, key

        # The checkpoint's merged export with the EMA adapters equals the adapted model holding them.
        _, ref_ema = reference_step(name, lora=True)
        adapted = build(name, lora=True, transform=False)
        with torch.no_grad():
            for n, p in adapted.named_parameters():
                if n in ref_ema:
                    p.copy_(ref_ema[n])
        merged = export_merged(families.build(name), ranks[0][("zero1", True)]["checkpoint"],
                               os.path.join(root, "merged.safetensors"), use_ema=True,
                               lora=dict(rank=RANK, alpha=ALPHA, dropout=0.0, targets=None))
        plain = load_weights(families.build(name, seed=5), merged)
        inputs = families.forward_inputs(name)
        with torch.no_grad():
            torch.testing.assert_close(families.output(plain, inputs), families.output(adapted, inputs),
                                       rtol=1e-5, atol=1e-5)
