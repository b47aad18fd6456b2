"""Sequence parallelism (Ulysses and ring at sp_size=2 on 2 gloo ranks; ring, USP 2 x 2 and a 2 (data) x
2 (sequence) mesh on 4) for models written outside the zoo, against the serial model: outputs and the
world mean of every parameter gradient (fp32, 1e-5). The diffusers DiT and PixArt have 2 heads, so
ring at sp 4 runs more ranks than heads.

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
from opendit_lite.parallel import SequenceParallelOp, UlyssesAttentionOp, apply_sequence_parallel
from opendit_lite.parallel.ulysses import SequenceParallelCrossAttentionOp
from opendit_lite.parallelization import parallelize
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


def _sequence_parallel(model, how: str, group=None):
    """``how``: "apply" (apply_sequence_parallel alone), "parallelize" (fused AdaLN, attention
    backend and Ulysses), "parallelize+ac" (Ulysses and activation checkpointing of half the blocks),
    or a mode ("ring", "usp": parallelize in that mode; USP with a ring of 2)."""
    group = group or dist.group.WORLD
    if how == "apply":
        return apply_sequence_parallel(model, group)
    if how == "parallelize":
        parallelize(model, sp_group=group, fused_adaln=True, attention_backend="auto")
    elif how == "parallelize+ac":
        parallelize(model, sp_group=group, selective_ratio=0.5)
    else:
        parallelize(model, sp_group=group, sp_mode=how, sp_ring_size=2 if how == "usp" else None)
    return model


CASES = {"meta_dit": (fm.meta_dit, fm.meta_dit_inputs), "user_dit": (fm.user_dit, fm.user_dit_inputs),
         "diffusers_dit": (fm.tiny_diffusers_dit, fm.diffusers_dit_inputs),
         "pixart": (fm.tiny_pixart, fm.pixart_inputs)}


def _modes(cases: dict, group=None) -> dict:
    """{name/how: errors and the sequence-parallel ops made} for (name, how) in ``cases``."""
    out = {}
    for name, how in cases:
        build, inputs = CASES[name]
        serial = build()
        parallel = _sequence_parallel(copy.deepcopy(serial), how, group)
        out[f"{name}/{how}"] = _errors(serial, parallel, inputs())
        out[f"{name}/{how}"]["ops"] = sorted({type(m).__name__ for m in parallel.modules()
                                              if isinstance(m, SequenceParallelOp)})
    return out


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
    out.update(_modes([(name, "ring") for name in CASES]))
    return out


@rank_checks("foreign models", world_size=4)
def _checks_world4(rank: int, world_size: int) -> dict:
    """sp 4: ring for every model (2 heads < 4 ranks for the diffusers ones), USP 2 x 2 for the 4-head
    ones; dp 2 x sp 2 ring for PixArt (every rank feeds the same batch, so the world mean is serial)."""
    out = _modes([(name, "ring") for name in CASES] + [("meta_dit", "usp"), ("user_dit", "usp")])
    sp_group = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    out.update({f"dp2xsp2 {k}": v for k, v in _modes([("pixart", "ring")], sp_group).items()})
    return out


@pytest.mark.parametrize("world,key,ops", [
    (2, "meta_dit/ring", ["RingAttentionOp"]), (2, "user_dit/ring", ["RingAttentionOp"]),
    (2, "diffusers_dit/ring", ["RingAttentionOp"]),
    (2, "pixart/ring", ["RingAttentionOp", "SequenceParallelCrossAttentionOp"]),
    (4, "meta_dit/ring", ["RingAttentionOp"]), (4, "user_dit/ring", ["RingAttentionOp"]),
    (4, "diffusers_dit/ring", ["RingAttentionOp"]),
    (4, "pixart/ring", ["RingAttentionOp", "SequenceParallelCrossAttentionOp"]),
    (4, "meta_dit/usp", ["USPAttentionOp"]), (4, "user_dit/usp", ["USPAttentionOp"]),
    (4, "dp2xsp2 pixart/ring", ["RingAttentionOp", "SequenceParallelCrossAttentionOp"]),
])
def test_ring_and_usp_match_serial(world, key, ops):
    for rank, result in enumerate(spawn_results("foreign models", world)):
        errors = result[key]
        assert errors["missing"] == [], f"rank {rank} {key}: parameters without gradient {errors['missing']}"
        assert errors["out"] < TOL and errors["grad"] < TOL, f"rank {rank} {key}: {errors}"
        assert errors["ops"] == ops, f"rank {rank} {key}: {errors['ops']}"


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
