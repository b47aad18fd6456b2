"""Sequence parallelism (Ulysses, sp_size=2 on 2 gloo ranks) for models written outside the zoo,
against the serial model: outputs and the world mean of every parameter gradient (fp32, 1e-5).

A user's own model (both protocols) goes through ``parallelize`` with fused AdaLN and Ulysses
(the fused kernels are checked on Meta's DiT serially in tests/converter; they run slowly in
Triton's interpreter), diffusers' DiT through ``parallelize`` with activation checkpointing of half
its blocks; Meta's DiT (timm attention) and PixArt (self- and cross-attention processors, a caption
key mask) through ``apply_sequence_parallel`` alone. None of them has split/gather markers: the
boundaries sit at their block list.
"""

import copy

import pytest
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from opendit_lite.config import ConfigError
from opendit_lite.parallel import UlyssesAttentionOp, apply_sequence_parallel
from opendit_lite.parallel.ulysses import SequenceParallelCrossAttentionOp
from opendit_lite.transforms import parallelize
from tests import foreign_models as fm
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

TOL = 1e-5


def _forward_backward(model, inputs):
    args, kwargs = (inputs, {}) if isinstance(inputs, tuple) else ((), inputs)
    out = model(*args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    (out ** 2).mean().backward()
    return out.detach()


def _errors(serial: nn.Module, parallel: nn.Module, inputs) -> dict:
    expected = _forward_backward(serial, inputs)
    got = _forward_backward(parallel, inputs)
    grad_err, missing = 0.0, []
    ref = dict(serial.named_parameters())
    for name, p in parallel.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            missing.append(name)
            continue
        g = p.grad.clone()
        dist.all_reduce(g)
        grad_err = max(grad_err, (g / dist.get_world_size() - ref[name].grad).abs().max().item())
    return {"out": (got - expected).abs().max().item(), "grad": grad_err, "missing": missing}


def _sequence_parallel(model, how: str):
    """``how``: "apply" (apply_sequence_parallel alone), "parallelize" (fused AdaLN, attention
    backend and Ulysses), "parallelize+ac" (Ulysses and activation checkpointing of half the blocks)."""
    if how == "apply":
        return apply_sequence_parallel(model, dist.group.WORLD)
    if how == "parallelize":
        parallelize(model, sp_group=dist.group.WORLD, fused_adaln=True, attention_backend="auto")
    else:
        parallelize(model, sp_group=dist.group.WORLD, selective_ratio=0.5)
    return model


class SerialAttentionBlock(nn.Module):
    """A block whose attention calls SDPA inline: sequence parallelism cannot see it."""

    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return x + F.scaled_dot_product_attention(q, k, v)


@rank_checks("foreign models", world_size=2)
def _checks(rank: int, world_size: int) -> dict:
    out = {}
    cases = {
        "meta_dit": (fm.meta_dit, fm.meta_dit_inputs, "apply"),
        "user_dit": (fm.user_dit, fm.user_dit_inputs, "parallelize"),
        "diffusers_dit": (fm.tiny_diffusers_dit, fm.diffusers_dit_inputs, "parallelize+ac"),
        "pixart": (fm.tiny_pixart, fm.pixart_inputs, "apply"),
    }
    for name, (build, inputs, how) in cases.items():
        serial = build()
        parallel = _sequence_parallel(copy.deepcopy(serial), how)
        out[name] = _errors(serial, parallel, inputs())
        ops = [type(m).__name__ for m in parallel.modules() if isinstance(m, (UlyssesAttentionOp,
                                                                            SequenceParallelCrossAttentionOp))]
        out[name]["ops"] = sorted(set(ops)), len(ops)
        out[name]["fused"] = sum(type(m).__name__ == "AdaLNLayerNorm" for m in parallel.modules())

    # 9 tokens: padded to 10 by the split, cut before attention, dropped by the gather.
    serial = fm.tiny_diffusers_dit(sample_size=6)
    inputs = fm.diffusers_dit_inputs()
    inputs["hidden_states"] = inputs["hidden_states"][..., :6, :6]
    out["padded"] = _errors(serial, apply_sequence_parallel(copy.deepcopy(serial), dist.group.WORLD), inputs)

    # An EMA copy made after conversion runs on its own.
    ema = copy.deepcopy(parallel)
    out["ema"] = (ema(**fm.pixart_inputs())[0] - parallel(**fm.pixart_inputs())[0]).abs().max().item()

    unknown = nn.Sequential(nn.Linear(4, 8), nn.ModuleList([SerialAttentionBlock(8), SerialAttentionBlock(8)]))
    try:
        apply_sequence_parallel(unknown, dist.group.WORLD)
        out["unknown"] = None
    except TypeError as e:
        out["unknown"] = str(e)
    try:
        parallelize(unknown, sp_group=dist.group.WORLD)
        out["unknown_parallelize"] = None
    except ConfigError as e:
        out["unknown_parallelize"] = str(e)
    return out


@pytest.mark.parametrize("name", ["meta_dit", "user_dit", "diffusers_dit", "pixart", "padded"])
def test_sequence_parallel_matches_serial(name):
    for rank, result in enumerate(spawn_results("foreign models", 2)):
        errors = result[name]
        assert errors["missing"] == [], f"rank {rank}: parameters without gradient {errors['missing']}"
        assert errors["out"] < TOL and errors["grad"] < TOL, f"rank {rank}: {errors}"


def test_expected_swaps_were_made():
    result = spawn_results("foreign models", 2)[0]
    assert result["meta_dit"]["ops"] == (["UlyssesAttentionOp"], 2)
    assert result["user_dit"]["ops"] == (["UlyssesAttentionOp"], 2) and result["user_dit"]["fused"] == 4
    assert result["diffusers_dit"]["ops"] == (["UlyssesAttentionOp"], 2)
    assert result["pixart"]["ops"] == (["SequenceParallelCrossAttentionOp", "UlyssesAttentionOp"], 4)
    assert result["ema"] < TOL


def test_unknown_attention_raises_naming_the_class_and_the_protocol():
    for key in ("unknown", "unknown_parallelize"):
        message = spawn_results("foreign models", 2)[0][key]
        assert message is not None and "SerialAttentionBlock" in message
        assert "attn_op" in message and "sequence_parallel_attention" in message
