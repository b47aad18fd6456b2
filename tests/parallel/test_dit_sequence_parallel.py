"""Sequence-parallel DiT against the serial DiT: output, every parameter gradient, training steps.

The rule checked everywhere: the world mean of the local gradients (what DDP and ZeRO compute)
equals the serial model's gradient on the global batch. The shared spawn of each world size
(``spawn.py``) runs all checks: world 2 (sp 2; apply_sequence_parallel and parallelize, Ulysses and
ring; activation checkpointing; training through OpenDiTPlugin with zero_degree 0, 1, 2 under Ulysses
and 0, 2 under ring) and world 4 (sp 4 Ulysses, ring, USP 2 x 2, a 2-head DiT at sp 4 under ring and
under sp_mode=auto, and dp 2 x sp 2 Ulysses and ring). The latent 10x6 with patch 2 gives 15 tokens,
not divisible by 2 or 4, so padding is exercised throughout.
"""

import copy
import functools
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from opendit_lite.models import build_model
from opendit_lite.models.layers.attention import AttentionOp, SDPAAttentionOp
from opendit_lite.models.layers.sequence import SequenceGather, SequenceSplit
from opendit_lite.parallel import (
    RingAttentionOp,
    SequenceParallelOp,
    SequenceParallelSplit,
    UlyssesAttentionOp,
    USPAttentionOp,
    apply_sequence_parallel,
    register_sequence_parallel_attention,
)
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

TOL = 1e-5  # fp32
PER_RANK_BATCH = 2


def tiny_dit(input_size, num_heads: int = 4) -> nn.Module:
    from opendit_lite.models.dit import DiT

    torch.manual_seed(0)
    if num_heads == 4:
        model = build_model("DiT-T/2", input_size=input_size, num_classes=10, class_dropout_prob=0.0)
    else:  # DiT-T/2's width and depth with another head count
        model = DiT(input_size=input_size, depth=2, hidden_size=64, num_heads=num_heads, num_classes=10,
                    class_dropout_prob=0.0)
    # DiT zero-initialises its adaLN and output layers; perturb every weight so that every
    # parameter gets a non-trivial gradient.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def batch(global_batch: int, input_size, seed: int):
    """(x, t, y, target) of the global batch, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(global_batch, 4, *input_size, generator=g)
    t = torch.randint(0, 1000, (global_batch,), generator=g)
    y = torch.randint(0, 10, (global_batch,), generator=g)
    target = torch.randn(global_batch, 8, *input_size, generator=g)
    return x, t, y, target


def world_mean_grads(model: nn.Module) -> dict:
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            g = p.grad.clone()
            dist.all_reduce(g)
            grads[name] = g / dist.get_world_size()
    return grads


def compare_with_serial(mesh, input_size, convert, block_wrapper=None, num_heads: int = 4) -> dict:
    """Worst forward and gradient error of the SP model made by ``convert`` vs the serial model."""
    serial = tiny_dit(input_size, num_heads)
    sp_model = convert(copy.deepcopy(serial), mesh.sp_group)
    if block_wrapper is not None:
        block_wrapper(sp_model)
    x, t, y, target = batch(PER_RANK_BATCH * mesh.dp_size, input_size, seed=1)
    mine = slice(mesh.dp_rank * PER_RANK_BATCH, (mesh.dp_rank + 1) * PER_RANK_BATCH)

    out = sp_model(x[mine], t[mine], y[mine])
    F.mse_loss(out, target[mine]).backward()
    sp_grads = world_mean_grads(sp_model)

    ref = serial(x, t, y)
    F.mse_loss(ref, target).backward()
    grad_errors = {n: (sp_grads[n] - p.grad).abs().max().item()
                   for n, p in serial.named_parameters() if p.requires_grad}
    return {
        "forward": (out - ref[mine]).abs().max().item(),
        "grads": max(grad_errors.values()),
        "grads_checked": len(grad_errors),
        "grads_nonzero": sum(p.grad.abs().max().item() > 0 for p in serial.parameters() if p.requires_grad),
        "ulysses_ops": sum(isinstance(m, UlyssesAttentionOp) for m in sp_model.modules()),
        "ops": sorted({type(m).__name__ for m in sp_model.modules() if isinstance(m, SequenceParallelOp)}),
        "op_count": sum(isinstance(m, SequenceParallelOp) for m in sp_model.modules()),
    }


def via_parallelize(model, sp_group, sp_mode="ulysses", sp_ring_size=None):
    from opendit_lite.parallelization import parallelize

    parallelize(model, sp_group=sp_group, sp_mode=sp_mode, sp_ring_size=sp_ring_size)
    return model


def in_mode(sp_mode, sp_ring_size=None):
    """A ``convert`` for compare_with_serial: parallelize in ``sp_mode``."""
    return functools.partial(via_parallelize, sp_mode=sp_mode, sp_ring_size=sp_ring_size)


def checkpoint_blocks(model):
    """Activation checkpointing per block: the recomputation repeats the all-to-alls."""
    for block in model.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


# ---------------------------------------------------------------------------- training

def train_steps(mesh, zero_degree: int, steps: int = 3, sp_mode: str = "ulysses") -> float:
    """Largest weight difference after ``steps`` optimizer steps: SP through OpenDiTPlugin vs serial.

    SGD with momentum rather than AdamW: Adam's first steps are about +-lr for any nonzero
    gradient, so entries whose true gradient is zero (the key bias: softmax ignores a shift shared
    by all keys) would turn rounding noise into differences of lr. SGD keeps the comparison at
    rounding level; what is under test is the gradient the plugin hands the optimizer.
    """
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin
    from tests.zero_cpu_shim import install as install_zero_cpu_shim

    install_zero_cpu_shim()  # LowLevelZero on gloo/CPU
    input_size = (10, 6)
    serial = tiny_dit(input_size)
    sp_model = apply_sequence_parallel(copy.deepcopy(serial), mesh.sp_group, mode=sp_mode)
    plugin = OpenDiTPlugin(zero_degree=zero_degree, sp_size=mesh.sp_size, precision="fp32", grad_clip=1.0)
    booster = Booster(plugin=plugin)
    sp_model, optimizer, *_ = booster.boost(sp_model, torch.optim.SGD(sp_model.parameters(), lr=0.1, momentum=0.9))
    serial_opt = torch.optim.SGD(serial.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, t, y, target = batch(PER_RANK_BATCH * mesh.dp_size, input_size, seed=100 + step)
        mine = slice(mesh.dp_rank * PER_RANK_BATCH, (mesh.dp_rank + 1) * PER_RANK_BATCH)
        booster.backward(F.mse_loss(sp_model(x[mine], t[mine], y[mine]), target[mine]), optimizer)
        optimizer.step()
        optimizer.zero_grad()

        F.mse_loss(serial(x, t, y), target).backward()
        nn.utils.clip_grad_norm_(serial.parameters(), 1.0)
        serial_opt.step()
        serial_opt.zero_grad()
    trained = dict(sp_model.unwrap().named_parameters())
    return max((trained[n].detach() - p.detach()).abs().max().item() for n, p in serial.named_parameters())


# ----------------------------------------------------------------------- conversion checks

class _Unmarked(nn.Module):
    """A model without SequenceSplit/SequenceGather markers or repeated blocks to shard at."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)


class _Holder(nn.Module):
    """An unregistered module type holding an attention op."""

    def __init__(self):
        super().__init__()
        self.attn_op = SDPAAttentionOp()


class _MarkedWithUnknownAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq_split, self.holder, self.seq_gather = SequenceSplit(), _Holder(), SequenceGather()


class _MarkedWithSerialAttention(nn.Module):
    """Declares its attention op serial (e.g. temporal attention when spatial tokens are sharded)."""

    def __init__(self):
        super().__init__()
        self.seq_split, self.temporal, self.seq_gather = SequenceSplit(), _SerialHolder(), SequenceGather()


class _SerialHolder(_Holder):
    pass


def _error(exc_type, fn) -> str:
    try:
        fn()
    except exc_type as e:
        return str(e)
    return "no error"


def conversion_checks(sp_group) -> dict:
    out = {
        "no_markers": _error(ValueError, lambda: apply_sequence_parallel(_Unmarked(), sp_group)),
        "unregistered": _error(TypeError, lambda: apply_sequence_parallel(_MarkedWithUnknownAttention(), sp_group)),
    }
    unknown = _MarkedWithUnknownAttention()
    _error(TypeError, lambda: apply_sequence_parallel(unknown, sp_group))
    out["untouched_after_error"] = isinstance(unknown.seq_split, SequenceSplit)

    # Registers globally, which is fine in this spawned process.
    register_sequence_parallel_attention(_SerialHolder, None)
    kept = apply_sequence_parallel(_MarkedWithSerialAttention(), sp_group)
    out["serial_kept"] = type(kept.temporal.attn_op) is SDPAAttentionOp
    out["serial_markers_converted"] = isinstance(kept.seq_split, SequenceParallelSplit)

    model = apply_sequence_parallel(tiny_dit((10, 6)), sp_group)
    # SP ranks fed different samples (e.g. noise seeded per global rank) fail on the first step.
    x, t, y, _ = batch(2, (10, 6), seed=10 + dist.get_rank())
    out["different_inputs"] = _error(RuntimeError, lambda: model(x, t, y))
    out["twice"] = _error(ValueError, lambda: apply_sequence_parallel(model, sp_group))
    # An EMA-style deep copy: same outputs, its own state, the same process group.
    twin = copy.deepcopy(model)
    x, t, y, _ = batch(2, (10, 6), seed=3)
    with torch.no_grad():
        out["deepcopy_forward"] = (twin(x, t, y) - model(x, t, y)).abs().max().item()
    out["deepcopy_own_state"] = twin.seq_split.state is not model.seq_split.state
    out["deepcopy_shares_state"] = twin.blocks[0].attn.attn_op.state is twin.seq_split.state
    out["deepcopy_same_group"] = twin.seq_split.state.group is model.seq_split.state.group
    return out


# ------------------------------------------------------------------------------- spawns

@rank_checks("dit", world_size=2)
def _rank_world2(rank, world_size):
    from opendit_lite.distributed.mesh import build_data_seq_mesh

    mesh = build_data_seq_mesh(2)
    return {
        "sp2_apply_15": compare_with_serial(mesh, (10, 6), apply_sequence_parallel),
        "sp2_parallelize_16": compare_with_serial(mesh, (8, 8), via_parallelize),
        "sp2_checkpoint_15": compare_with_serial(mesh, (10, 6), apply_sequence_parallel, checkpoint_blocks),
        "sp2_ring_15": compare_with_serial(mesh, (10, 6), in_mode("ring")),
        "sp2_ring_checkpoint_15": compare_with_serial(mesh, (10, 6), in_mode("ring"), checkpoint_blocks),
        "conversion": conversion_checks(mesh.sp_group),
        "train": {z: train_steps(mesh, z) for z in (0, 1, 2)},
        "train_ring": {z: train_steps(mesh, z, sp_mode="ring") for z in (0, 2)},
    }


class Mesh(NamedTuple):
    dp_size: int
    dp_rank: int
    sp_size: int
    sp_group: object


def consecutive_mesh(sp_size: int) -> Mesh:
    """OpenDiTPlugin's layout (SP groups of consecutive ranks) without importing Colossal-AI,
    whose import in four processes on two cores costs more than the checks."""
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(start, start + sp_size))) for start in range(0, world, sp_size)]
    return Mesh(world // sp_size, rank // sp_size, sp_size, groups[rank // sp_size])


@rank_checks("dit", world_size=4)
def _rank_world4(rank, world_size):
    sp4, dp2_sp2 = consecutive_mesh(4), consecutive_mesh(2)
    return {
        "sp4_15": compare_with_serial(sp4, (10, 6), apply_sequence_parallel),
        "dp2_sp2_15": compare_with_serial(dp2_sp2, (10, 6), apply_sequence_parallel),
        "sp4_ring_15": compare_with_serial(sp4, (10, 6), in_mode("ring")),
        "sp4_usp_15": compare_with_serial(sp4, (10, 6), in_mode("usp", 2)),
        "dp2_sp2_ring_15": compare_with_serial(dp2_sp2, (10, 6), in_mode("ring")),
        "sp4_ring_2heads_15": compare_with_serial(sp4, (10, 6), in_mode("ring"), num_heads=2),
        "sp4_auto_2heads_15": compare_with_serial(sp4, (10, 6), in_mode("auto"), num_heads=2),
    }


def results(world_size: int) -> list:
    return spawn_results("dit", world_size)


def assert_matches_serial(per_rank: list, key: str, depth: int = 2, op=UlyssesAttentionOp) -> None:
    for rank, r in enumerate(per_rank):
        c = r[key]
        assert c["forward"] < TOL, f"rank {rank} {key}: forward differs by {c['forward']:.3g}"
        assert c["grads"] < TOL, f"rank {rank} {key}: a gradient differs by {c['grads']:.3g}"
        assert c["ops"] == [op.__name__] and c["op_count"] == depth, f"rank {rank} {key}: {c['ops']} x{c['op_count']}"
        # Every parameter is compared, and the perturbed model gives each a real gradient.
        assert c["grads_nonzero"] == c["grads_checked"] > 0


# ------------------------------------------------------------------------------- tests

def test_sp2_matches_serial_with_padding():
    assert_matches_serial(results(2), "sp2_apply_15")


def test_sp2_through_parallelize():
    assert_matches_serial(results(2), "sp2_parallelize_16")


def test_sp2_with_activation_checkpointing():
    assert_matches_serial(results(2), "sp2_checkpoint_15")


def test_sp4_matches_serial_with_padding():
    assert_matches_serial(results(4), "sp4_15")


def test_dp2_sp2_world_mean_is_serial_gradient():
    assert_matches_serial(results(4), "dp2_sp2_15")


@pytest.mark.parametrize("world,key,op", [
    (2, "sp2_ring_15", RingAttentionOp), (2, "sp2_ring_checkpoint_15", RingAttentionOp),
    (4, "sp4_ring_15", RingAttentionOp), (4, "sp4_usp_15", USPAttentionOp), (4, "dp2_sp2_ring_15", RingAttentionOp),
    (4, "sp4_ring_2heads_15", RingAttentionOp),      # more ranks than heads
    (4, "sp4_auto_2heads_15", USPAttentionOp),       # auto: ring 2 x Ulysses 2 for 2 heads at sp 4
])
def test_ring_and_usp_match_serial(world, key, op):
    assert_matches_serial(results(world), key, op=op)


@pytest.mark.parametrize("zero_degree", [0, 2])
def test_training_steps_under_ring_equal_serial(zero_degree):
    for rank, r in enumerate(results(2)):
        diff = r["train_ring"][zero_degree]
        assert diff < TOL, f"rank {rank}, zero_degree {zero_degree}: weights differ by {diff:.3g} after 3 ring steps"


@pytest.mark.parametrize("zero_degree", [0, 1, 2])
def test_training_steps_sp2_equal_serial(zero_degree):
    for rank, r in enumerate(results(2)):
        diff = r["train"][zero_degree]
        assert diff < TOL, f"rank {rank}, zero_degree {zero_degree}: weights differ by {diff:.3g} after 3 steps"


def test_apply_sequence_parallel_checks_the_model():
    c = results(2)[0]["conversion"]
    assert "no SequenceSplit/SequenceGather markers and no block list" in c["no_markers"]
    assert "holder.attn_op" in c["unregistered"] and "register_sequence_parallel_attention" in c["unregistered"]
    assert c["untouched_after_error"]
    assert c["serial_kept"] and c["serial_markers_converted"]
    assert "already sequence-parallel" in c["twice"]
    assert "ranks of a sequence-parallel group hold different tokens" in c["different_inputs"]


def test_deepcopy_of_sp_model():
    c = results(2)[0]["conversion"]
    assert c["deepcopy_forward"] == 0.0
    assert c["deepcopy_own_state"] and c["deepcopy_shares_state"] and c["deepcopy_same_group"]


def test_group_of_one_is_a_no_op():
    model = tiny_dit((10, 6))
    assert apply_sequence_parallel(model, None) is model
    assert isinstance(model.seq_split, SequenceSplit) and isinstance(model.blocks[0].attn.attn_op, SDPAAttentionOp)


def test_duplicate_registration_is_an_error():
    from opendit_lite.models.layers.attention import Attention

    with pytest.raises(ValueError, match="already has a sequence-parallel attention entry"):
        register_sequence_parallel_attention(Attention, UlyssesAttentionOp)
    assert issubclass(UlyssesAttentionOp, AttentionOp)


@pytest.mark.gpu
def test_dit_xl2_step_with_sp_size_1_on_gpu():
    """A group of one rank converts nothing for SP: a DiT-XL/2 bf16 training step runs as before."""
    from opendit_lite.parallel import SequenceParallelOp
    from opendit_lite.parallelization import parallelize

    model = build_model("DiT-XL/2", input_size=32).cuda()
    parallelize(model, sp_group=None, attention_backend="auto")
    assert not any(isinstance(m, (SequenceParallelSplit, SequenceParallelOp)) for m in model.modules())
    x, t, y, target = (v.cuda() for v in batch(4, (32, 32), seed=0))
    y = y % 1000
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x, t, y)
    loss = F.mse_loss(out.float(), target)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
