"""Sequence-parallel collectives and attention ops on gloo ranks, against serial references here.

Every check runs in the shared spawn of its world size (``spawn.py``) and returns its worst
mismatch; the tests below read their entry. World 4 also runs each check on the
two consecutive-rank sub-groups {0, 1} and {2, 3}, so ranks inside a group differ from global ranks.
All in float64: the collectives only move data, so the results must match to rounding.
"""

import pytest
import torch
import torch.distributed as dist

from opendit_lite.models.layers.attention import SDPAAttentionOp
from opendit_lite.parallel import (
    SequenceParallelCrossAttentionOp,
    SequenceParallelState,
    UlyssesAttentionOp,
    all_to_all,
    gather_sequence,
    split_sequence,
)
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

B, H, DH, M = 2, 4, 3, 7  # batch, heads, head dim, context length


# ---------------------------------------------------------------------------------- references

def ref_shard(x: torch.Tensor, rank: int, parts: int, dim: int) -> torch.Tensor:
    """Rank's block of ``x`` along ``dim`` after zero-padding it to a multiple of ``parts``."""
    chunk = -(-x.size(dim) // parts)
    pad_shape = list(x.shape)
    pad_shape[dim] = chunk * parts - x.size(dim)
    padded = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
    return padded.split(chunk, dim=dim)[rank]


def ref_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d)) v with a boolean mask (True = may attend), [B, N, H, Dh] layout."""
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) / q.size(-1) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhnm,bmhd->bnhd", scores.softmax(-1), v)


def random_mask(*shape, generator):
    """Random boolean mask whose last-dim rows each allow at least one position."""
    mask = torch.rand(*shape, generator=generator) < 0.6
    mask[..., 0] = True
    return mask


def err(a, b) -> float:
    return (a - b).abs().max().item()


def mean_over_group(t: torch.Tensor, group) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t, group=group)
    return t / dist.get_world_size(group)


def expect_error(exc_type, fn) -> str:
    try:
        fn()
    except exc_type as e:
        return str(e)
    return "no error"


# ------------------------------------------------------------------------------ per-rank checks

def _check_all_to_all(group, gen):
    rank, parts = dist.get_rank(group), dist.get_world_size(group)
    full = torch.randn(B, 8, H, DH, generator=gen, dtype=torch.float64)     # [B, N, H, Dh]
    upstream = torch.randn(B, 8, H, DH, generator=gen, dtype=torch.float64)
    x = full.chunk(parts, 1)[rank].clone().requires_grad_()                 # sequence shard
    y = all_to_all(x, group, scatter_dim=2, gather_dim=1)                   # head shard
    (y * upstream.chunk(parts, 2)[rank]).sum().backward()
    back = all_to_all(y, group, scatter_dim=-3, gather_dim=-2)               # negative dims
    odd = torch.zeros(B, parts + 1, H, DH)
    return {
        "a2a_indivisible_error": expect_error(ValueError, lambda: all_to_all(odd, group, 1, 2)),
        "a2a_same_dim_error": expect_error(ValueError, lambda: all_to_all(odd, group, 2, 2)),
        "a2a_forward": err(y, full.chunk(parts, 2)[rank]),
        # The exchange is a permutation, so each input gets exactly its element's upstream grad.
        "a2a_backward": err(x.grad, upstream.chunk(parts, 1)[rank]),
        "a2a_round_trip": err(back, x),
    }


def _check_split_gather(group, gen):
    rank, parts = dist.get_rank(group), dist.get_world_size(group)
    out = {}
    for n in (5, 8):  # 5 is not a multiple of 2 or 4 (with 4 ranks the last shard is all padding)
        full = torch.randn(B, n, 3, generator=gen, dtype=torch.float64, requires_grad=True)
        upstream = torch.randn(B, n, 3, generator=gen, dtype=torch.float64)
        local = split_sequence(full, group, dim=1)
        gathered = gather_sequence(local, group, dim=1, length=n)
        # Different upstream gradients per rank: rank r's loss weighs by (r + 1).
        (gathered * upstream * (rank + 1)).sum().backward()
        total = sum(range(1, parts + 1))
        out[f"split_forward_{n}"] = err(local, ref_shard(full.detach(), rank, parts, 1))
        out[f"gather_forward_{n}"] = err(gathered, full)
        # Split backward places the shard's grad in zeros; gather backward sums every rank's
        # upstream grad for the shard. So rank r's grad is the summed upstream on its shard only.
        expected = torch.zeros_like(full)
        chunk = -(-n // parts)
        lo, hi = min(rank * chunk, n), min((rank + 1) * chunk, n)
        expected[:, lo:hi] = upstream[:, lo:hi] * total
        out[f"split_gather_backward_{n}"] = err(full.grad, expected)
    # Identical upstream on every rank (the training case): the group mean is the serial grad.
    full = torch.randn(B, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(B, 5, 3, generator=gen, dtype=torch.float64)
    (gather_sequence(split_sequence(full, group, 1), group, 1, 5) * upstream).sum().backward()
    out["split_gather_group_mean"] = err(mean_over_group(full.grad, group), upstream)
    return out


def _check_ulysses(group, gen):
    parts = dist.get_world_size(group)
    out = {}
    for n, masked in ((8, False), (5, False), (5, True)):
        q, k, v = (torch.randn(B, n, H, DH, generator=gen, dtype=torch.float64, requires_grad=True)
                   for _ in range(3))
        mask = random_mask(B, H, n, n, generator=gen) if masked else None
        upstream = torch.randn(B, n, H, DH, generator=gen, dtype=torch.float64)
        state = SequenceParallelState(group)
        state.seq_len = n
        op = UlyssesAttentionOp(SDPAAttentionOp(), state)
        local = op(*(split_sequence(t, group, 1) for t in (q, k, v)), attn_mask=mask)
        sp_out = gather_sequence(local, group, 1, n)
        (sp_out * upstream).sum().backward()
        sp_grads = [mean_over_group(t.grad, group) for t in (q, k, v)]
        q0, k0, v0 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        ref = ref_attention(q0, k0, v0, mask)
        (ref * upstream).sum().backward()
        tag = f"{n}{'_mask' if masked else ''}"
        out[f"ulysses_forward_{tag}"] = err(sp_out, ref)
        out[f"ulysses_grad_{tag}"] = max(err(a, b.grad) for a, b in zip(sp_grads, (q0, k0, v0)))
    # Errors: heads not divisible by the group size; an op fed along an axis that is not sharded.
    state = SequenceParallelState(group)
    state.seq_len = 4
    op = UlyssesAttentionOp(SDPAAttentionOp(), state)
    odd = torch.zeros(B, 4 // parts, parts + 1, DH, dtype=torch.float64)
    out["ulysses_heads_error"] = expect_error(ValueError, lambda: op(odd, odd, odd))
    other_axis = torch.zeros(B, 3, H, DH, dtype=torch.float64)
    out["ulysses_axis_error"] = expect_error(ValueError, lambda: op(other_axis, other_axis, other_axis))
    state.seq_len = None
    local = torch.zeros(B, 2, H, DH, dtype=torch.float64)
    out["ulysses_no_split_error"] = expect_error(RuntimeError, lambda: op(local, local, local))
    return out


def _check_cross(group, gen):
    out = {}
    n = 5
    for kind in ("none", "key", "query"):
        q = torch.randn(B, n, H, DH, generator=gen, dtype=torch.float64, requires_grad=True)
        k, v = (torch.randn(B, M, H, DH, generator=gen, dtype=torch.float64, requires_grad=True)
                for _ in range(2))
        mask = {"none": None, "key": random_mask(B, 1, 1, M, generator=gen),
                "query": random_mask(B, 1, n, M, generator=gen)}[kind]
        upstream = torch.randn(B, n, H, DH, generator=gen, dtype=torch.float64)
        state = SequenceParallelState(group)
        state.seq_len = n
        op = SequenceParallelCrossAttentionOp(SDPAAttentionOp(), state)
        sp_out = gather_sequence(op(split_sequence(q, group, 1), k, v, attn_mask=mask), group, 1, n)
        (sp_out * upstream).sum().backward()
        sp_grads = [mean_over_group(t.grad, group) for t in (q, k, v)]
        q0, k0, v0 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        ref = ref_attention(q0, k0, v0, mask)
        (ref * upstream).sum().backward()
        out[f"cross_forward_{kind}"] = err(sp_out, ref)
        out[f"cross_grad_{kind}"] = max(err(a, b.grad) for a, b in zip(sp_grads, (q0, k0, v0)))
    state = SequenceParallelState(group)
    state.seq_len = n
    op = SequenceParallelCrossAttentionOp(SDPAAttentionOp(), state)
    q = torch.zeros(B, 3, H, DH, dtype=torch.float64)
    kv = torch.zeros(B, M, H, DH, dtype=torch.float64)
    bad = torch.ones(B, 1, n + 1, M, dtype=torch.bool)
    out["cross_mask_error"] = expect_error(ValueError, lambda: op(q, kv, kv, attn_mask=bad))
    return out


@rank_checks("collectives", world_size=2)
@rank_checks("collectives", world_size=4)
def _rank_checks(rank, world_size):
    groups = {"world": dist.new_group(list(range(world_size)))}
    if world_size == 4:  # every rank creates every group, in the same order
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        groups["pair"] = pairs[rank // 2]
    results = {}
    for name, group in groups.items():
        gen = torch.Generator().manual_seed(1234)  # the same tensors on every rank
        for check in (_check_all_to_all, _check_split_gather, _check_ulysses, _check_cross):
            for key, value in check(group, gen).items():
                results[f"{name}/{key}"] = value
    return results


def results(world_size: int) -> dict:
    """Per check, the worst value over ranks (errors: rank 0's message)."""
    per_rank = spawn_results("collectives", world_size)
    merged = {}
    for key in per_rank[0]:
        values = [r[key] for r in per_rank]
        merged[key] = values[0] if isinstance(values[0], str) else max(values)
    return merged


def numeric(world_size: int, prefix: str) -> dict:
    return {k: v for k, v in results(world_size).items()
            if k.split("/", 1)[1].startswith(prefix) and not isinstance(v, str)}


def assert_small(values: dict, tol: float = 1e-12) -> None:
    assert values, "no checks matched"
    bad = {k: v for k, v in values.items() if not v <= tol}
    assert not bad, f"mismatch above {tol}: {bad}"


# ------------------------------------------------------------------------------------- tests

WORLDS = [2, 4]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLDS)
def test_all_to_all_forward_backward(world_size):
    assert_small(numeric(world_size, "a2a_"))


@pytest.mark.parametrize("world_size", WORLDS)
def test_all_to_all_errors(world_size):
    r = results(world_size)
    assert "not divisible by the group size" in r["world/a2a_indivisible_error"]
    assert "must differ" in r["world/a2a_same_dim_error"]


@pytest.mark.parametrize("world_size", WORLDS)
def test_split_gather_with_padding(world_size):
    assert_small(numeric(world_size, "split_"))
    assert_small(numeric(world_size, "gather_"))


@pytest.mark.parametrize("world_size", WORLDS)
def test_ulysses_matches_serial_attention(world_size):
    assert_small(numeric(world_size, "ulysses_"))


@pytest.mark.parametrize("world_size", WORLDS)
def test_ulysses_errors(world_size):
    r = results(world_size)
    assert "not divisible by sp_size" in r["world/ulysses_heads_error"]
    assert "not the sharded one" in r["world/ulysses_axis_error"]
    assert "before the model's SequenceParallelSplit" in r["world/ulysses_no_split_error"]


@pytest.mark.parametrize("world_size", WORLDS)
def test_cross_attention_matches_serial(world_size):
    assert_small(numeric(world_size, "cross_"))
    assert "query rows" in results(world_size)["world/cross_mask_error"]
