"""The sequence-parallel attention ops of every mode against serial attention in fp32, at 2 and 4 gloo
ranks (in the shared spawn of ``spawn.py``), plus single-process tests of the ring's pieces.

Each self-attention case: whole q, k, v (leaves, the same on every rank of an SP group, different
across data-parallel groups), serial SDPA as the reference written here; the SP run splits them with
``split_sequence`` (padding), runs the op, gathers the output with ``gather_sequence`` and computes the
same loss on every rank. With the package's gradient convention the SP-group mean of each rank's leaf
gradients is the serial gradient; the checks compare outputs and those means (1e-5).

Cases: ulysses, ring and USP 2x2; N in {8P, 13, 9} (even, uneven, and at P = 4 with N = 9 the last
rank holds only padding); masks: none, bool key padding ``[B, 1, 1, N]``, per-head bool ``[B, H, N, N]``
with an empty query row and empty ring blocks, additive float ``[1, 1, N, N]`` with -inf; ring with 2
heads at sp 4 (more ranks than heads); the math kernel; overlap on vs off (bitwise) and the overlap
order (post -> compute -> wait at every step); joint attention (text queries or not, text mask bool or
additive) with the text output bitwise identical on every rank; a 2 (data) x 2 (sequence) mesh with
different data per data-parallel group; the errors that guide.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from opendit_lite.kernels.attention_op import SDPAAttentionOp
from opendit_lite.parallel.comm import gather_sequence, split_sequence
from opendit_lite.parallel.ring import LseMerge
from opendit_lite.parallel.ring_kernels import KERNELS
from opendit_lite.parallel.sequence import SequenceParallelState
from opendit_lite.parallel.ulysses import UlyssesAttentionOp, UlyssesJointAttentionOp
from opendit_lite.parallel.usp import (
    RingAttentionOp,
    RingJointAttentionOp,
    USPAttentionOp,
    USPJointAttentionOp,
    build_usp_groups,
    usp_layout,
)
from tests.parallel.outcome import error_message
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

TOL = 1e-5


def sdpa(q, k, v, mask=None):  # the serial reference, [B, N, H, Dh] layout
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=mask).transpose(1, 2)


def make_mask(kind, B, H, N, gen):
    if kind is None:
        return None
    if kind == "keypad":                                  # text-style key padding, bool
        mask = torch.ones(B, 1, 1, N, dtype=torch.bool)
        mask[-1, ..., N - 3:] = False
        return mask
    if kind == "general":                                 # per-head bool, with an empty row and empty blocks
        mask = torch.rand(B, H, N, N, generator=gen) > 0.3
        mask[0, 0, 1] = False                             # a query row with no key at all
        mask[:, :, : N // 3, N // 2:] = False             # a region that empties whole ring blocks
        return mask
    if kind == "float":                                   # additive, broadcast over batch and heads
        mask = torch.randn(1, 1, N, N, generator=gen)
        mask[..., 2, 3:] = float("-inf")
        return mask
    raise ValueError(kind)


def _mean_grad(x, group, size):
    g = x.grad.clone()
    dist.all_reduce(g, group=group)
    return g / size


def _err(a, b):
    return (a - b).abs().max().item()


def check_self(op_factory, group, B, N, H, Dh, mask_kind, seed):
    """Worst error of the output and of every (SP-mean) gradient against serial attention."""
    gen = torch.Generator().manual_seed(seed)
    full = [torch.randn(B, N, H, Dh, generator=gen) for _ in range(3)]
    weight = torch.randn(B, N, H, Dh, generator=gen)
    mask = make_mask(mask_kind, B, H, N, gen)
    ref_in = [x.clone().requires_grad_() for x in full]
    (sdpa(*ref_in, mask) * weight).sum().backward()
    ref = sdpa(*full, mask)

    state = SequenceParallelState(group)
    state.seq_len = N
    op = op_factory(state)
    sp_in = [x.clone().requires_grad_() for x in full]
    out = op(*(split_sequence(x, group, dim=1) for x in sp_in), attn_mask=mask)
    out_full = gather_sequence(out, group, dim=1, length=N)
    (out_full * weight).sum().backward()
    errors = [_err(out_full, ref)]
    errors += [_err(_mean_grad(x, group, state.size), r.grad) for x, r in zip(sp_in, ref_in)]
    return max(errors)


def check_joint(op_factory, group, B, M, N, H, Dh, text_mask, with_text_queries, seed):
    """Joint attention [text; video]: output, gradients, and the text output identical on every rank."""
    gen = torch.Generator().manual_seed(seed)
    text = [torch.randn(B, M, H, Dh, generator=gen) for _ in range(3)]
    video = [torch.randn(B, N, H, Dh, generator=gen) for _ in range(3)]
    w_text, w_video = torch.randn(B, M, H, Dh, generator=gen), torch.randn(B, N, H, Dh, generator=gen)
    key_mask = torch.ones(B, 1, 1, M, dtype=torch.bool)
    if text_mask:
        key_mask[0, ..., M - 2:] = False
    if text_mask == "float":
        key_mask = torch.zeros(B, 1, 1, M).masked_fill(~key_mask, float("-inf"))

    def loss(text_out, video_out):
        return (video_out * w_video).sum() + (0 if text_out is None else (text_out * w_text).sum())

    def allow(n):
        return torch.ones(B, 1, 1, n, dtype=torch.bool) if key_mask.dtype == torch.bool else torch.zeros(B, 1, 1, n)

    ref_t = [x.clone().requires_grad_() for x in text]
    ref_v = [x.clone().requires_grad_() for x in video]
    kq = [torch.cat([t, v], dim=1) for t, v in zip(ref_t, ref_v)]
    ref = sdpa(kq[0] if with_text_queries else ref_v[0], kq[1], kq[2], torch.cat([key_mask, allow(N)], dim=-1))
    ref_text, ref_video = (ref[:, :M], ref[:, M:]) if with_text_queries else (None, ref)
    loss(ref_text, ref_video).backward()

    state = SequenceParallelState(group)
    state.seq_len = N
    op = op_factory(state)
    sp_t = [x.clone().requires_grad_() for x in text]
    sp_v = [x.clone().requires_grad_() for x in video]
    shards = [split_sequence(x, group, dim=1) for x in sp_v]
    local = shards[0].size(1)
    q = torch.cat([sp_t[0], shards[0]], dim=1) if with_text_queries else shards[0]
    k, v = (torch.cat([t, s], dim=1) for t, s in zip(sp_t[1:], shards[1:]))
    out = op(q, k, v, attn_mask=torch.cat([key_mask, allow(local)], dim=-1))
    text_out = out[:, :M] if with_text_queries else None
    video_out = gather_sequence(out[:, -local:], group, dim=1, length=N)
    loss(text_out, video_out).backward()

    errors = {"out": _err(video_out, ref_video)}
    if with_text_queries:
        errors["out"] = max(errors["out"], _err(text_out, ref_text))
        copies = [torch.empty_like(text_out) for _ in range(state.size)]
        dist.all_gather(copies, text_out.detach().contiguous(), group=group)
        errors["text_differs_across_ranks"] = max(_err(c, copies[0]) for c in copies)
    grads = [_err(_mean_grad(x, group, state.size), r.grad) for x, r in zip(sp_t + sp_v, ref_t + ref_v)
             if x.grad is not None or r.grad is not None]
    errors["grad"] = max(grads)
    return errors


def overlap_order_ok(trace, size):
    """Every forward/backward step's K/V transfer was posted before that step's compute and waited for
    after it (the overlapped order)."""
    for phase in ("fwd", "bwd"):
        for step in range(size - 1):
            kinds = [what for what, label in trace if label == (phase, step)]
            if kinds != ["post", "compute", "wait"]:
                return False
    return True


def _ring(state, **kw):
    return RingAttentionOp(SDPAAttentionOp(), state, **kw)


def suite(rank, world):
    """Every check for this world size: {name: worst error (float) or a message (str)}."""
    results = {}
    torch.manual_seed(0)
    group = dist.new_group(list(range(world)))
    inner = SDPAAttentionOp()
    cases = [("ulysses", lambda s: UlyssesAttentionOp(inner, s)), ("ring", _ring)]
    joint_cases = [("ulysses-joint", lambda s: UlyssesJointAttentionOp(inner, s)),
                   ("ring-joint", lambda s: RingJointAttentionOp(inner, s))]
    if world == 4:
        usp = build_usp_groups(group, ring_size=2)
        cases.append(("usp2x2", lambda s: USPAttentionOp(inner, s, usp)))
        joint_cases.append(("usp2x2-joint", lambda s: USPJointAttentionOp(inner, s, usp)))

    for name, factory in cases:
        for N in (8 * world, 13, 9):                    # even, uneven, last rank(s) all padding (P = 4)
            for mask_kind in (None, "keypad", "general", "float"):
                results[f"{name} N={N} mask={mask_kind}"] = check_self(factory, group, 2, N, 4, 8, mask_kind, seed=N)
    if world == 4:                                     # more ranks than heads: ring only
        for N in (16, 13):
            results[f"ring 2 heads at sp4 N={N}"] = check_self(_ring, group, 2, N, 2, 8, "general", seed=7)
    results["ring math kernel"] = check_self(lambda s: _ring(s, kernel="math"), group, 1, 11, 4, 8, "general", 3)

    # overlap: the transfer is posted before the compute and waited for after it; off = the same bits
    outs = {}
    for overlap in (True, False):
        state = SequenceParallelState(group)
        state.seq_len = 11
        op = _ring(state, overlap=overlap)
        op.trace = [] if overlap else None
        torch.manual_seed(1)
        n = state.padded_len() // state.size
        q, k, v = (torch.randn(1, n, 4, 8, requires_grad=True) for _ in range(3))
        out = op(q, k, v)
        out.square().sum().backward()
        outs[overlap] = (out.detach(), q.grad, k.grad, v.grad)
        if overlap:
            results["overlap order"] = "ok" if overlap_order_ok(op.trace, world) else str(op.trace)
    results["overlap on vs off"] = max(_err(a, b) for a, b in zip(outs[True], outs[False]))

    for name, factory in joint_cases:
        for N, text_mask, text_q in ((8 * world, None, True), (13, "bool", True), (13, "float", True),
                                     (13, "bool", False)):
            errs = check_joint(factory, group, 2, 5, N, 4, 8, text_mask, text_q, seed=N)
            for key, value in errs.items():
                results[f"{name} N={N} text_mask={text_mask} text_q={text_q} {key}"] = value

    if world == 4:  # data x sequence mesh: 2 DP groups x 2 SP ranks, different data per DP group
        sp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
        seed = 100 + rank // 2
        mesh_cases = [("ring", _ring)]
        for ring_size in (1, 2):
            groups = build_usp_groups(sp, ring_size)
            mesh_cases.append((f"usp R={ring_size}", lambda s, g=groups: USPAttentionOp(inner, s, g)))
        for name, factory in mesh_cases:
            results[f"dp2xsp2 {name} N=7"] = check_self(factory, sp, 2, 7, 4, 8, "general", seed=seed)
        errs = check_joint(lambda s: RingJointAttentionOp(inner, s), sp, 2, 5, 7, 4, 8, "bool", True, seed=seed)
        results["dp2xsp2 ring-joint N=7"] = max(errs["out"], errs["grad"])

        # errors that guide
        state = SequenceParallelState(group)
        state.seq_len = 8
        three_heads = [torch.randn(1, 2, 3, 8) for _ in range(3)]
        results["usp heads error"] = error_message(lambda: USPAttentionOp(inner, state, usp)(*three_heads))
        results["ulysses heads error"] = error_message(lambda: UlyssesAttentionOp(inner, state)(*three_heads))
        results["ring size error"] = error_message(lambda: build_usp_groups(group, 3))
    return results


@rank_checks("ring and usp ops", world_size=2)
def _world2(rank, world_size):
    return suite(rank, world_size)


@rank_checks("ring and usp ops", world_size=4)
def _world4(rank, world_size):
    return suite(rank, world_size)


def merged(world):
    """The worst value over ranks of every check."""
    out = {}
    for per_rank in spawn_results("ring and usp ops", world):
        for key, value in per_rank.items():
            out[key] = value if isinstance(value, str) else max(out.get(key, value), value)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_exact_against_serial(world):
    errors = {k: v for k, v in merged(world).items() if not isinstance(v, str) and "differs_across" not in k}
    assert len(errors) > 30
    bad = {k: v for k, v in errors.items() if not v <= TOL}
    assert not bad, bad


@pytest.mark.parametrize("world", [2, 4])
def test_text_output_bitwise_identical_across_ranks_and_overlap(world):
    results = merged(world)
    values = {k: v for k, v in results.items() if "differs_across_ranks" in k}
    assert values and all(v == 0.0 for v in values.values()), values
    assert results["overlap order"] == "ok", results["overlap order"]
    assert results["overlap on vs off"] == 0.0


def test_errors_that_guide():
    results = merged(4)
    assert results["usp heads error"].startswith("SequenceParallelError: USP shards heads"), results["usp heads error"]
    assert "num_heads=3" in results["usp heads error"] and "sp_mode=ring" in results["usp heads error"]
    message = results["ulysses heads error"]
    assert message.startswith("SequenceParallelError: Ulysses") and "sp_mode=ring" in message, message
    assert "sp_ring_size=3 must divide sp_size=4" in results["ring size error"]


def test_usp_layout():
    ulysses, rings = usp_layout([10, 11, 12, 13, 14, 15], ring_size=3)
    assert ulysses == [(10, 11), (12, 13), (14, 15)] and rings == [(10, 12, 14), (11, 13, 15)]


@pytest.mark.parametrize("kernel", ["cpu_flash", "math"])
def test_block_kernels_split_by_keys_equal_full_attention(kernel):
    """Two key blocks merged by log-sum-exp, and their backward with the final lse, equal SDPA (fp64)."""
    torch.manual_seed(0)
    B, H, N, Dh = 2, 3, 10, 8
    q, k, v = (torch.randn(B, H, N, Dh, dtype=torch.float64) for _ in range(3))
    bias = torch.zeros(B, 1, N, N, dtype=torch.float64)
    bias[0, 0, 2, :6] = float("-inf")                    # a row with no key in the first block
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, attn_mask=bias)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    kern, scale, merge, cuts = KERNELS[kernel], Dh ** -0.5, LseMerge(), [(0, 6), (6, 10)]
    for a, b in cuts:
        out, lse = kern.forward(q, k[:, :, a:b], v[:, :, a:b], bias[..., a:b], scale)
        empty = ~(bias[..., a:b] > float("-inf")).any(-1)
        merge.add(out.masked_fill(empty.unsqueeze(-1), 0), lse.masked_fill(empty, float("-inf")))
    assert (merge.out - ref).abs().max() < 1e-12
    grads = [kern.backward(dout, q, k[:, :, a:b], v[:, :, a:b], merge.out.to(q.dtype), merge.lse,
                           bias[..., a:b], scale) for a, b in cuts]
    assert (sum(g[0] for g in grads) - ref_in[0].grad).abs().max() < 1e-12
    assert (torch.cat([g[1] for g in grads], 2) - ref_in[1].grad).abs().max() < 1e-12
    assert (torch.cat([g[2] for g in grads], 2) - ref_in[2].grad).abs().max() < 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype", [("cuda_efficient", torch.float32), ("cuda_efficient", torch.bfloat16),
                                          ("cuda_flash", torch.bfloat16)])
def test_cuda_block_kernels(kernel, dtype):
    """The ring's CUDA block kernels, split by keys and merged, against fp32 SDPA (forward and backward)."""
    torch.manual_seed(0)
    B, H, N, Dh = 2, 4, 200, 64
    q, k, v = (torch.randn(B, H, N, Dh, device="cuda", dtype=dtype) for _ in range(3))
    bias = None if kernel == "cuda_flash" else torch.zeros(B, 1, 1, N, device="cuda").masked_fill(
        torch.arange(N, device="cuda") > N - 7, float("-inf"))
    ref_in = [x.float().clone().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, attn_mask=bias)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    kern, merge, cuts = KERNELS[kernel], LseMerge(), [(0, 77), (77, N)]
    for a, b in cuts:
        merge.add(*kern.forward(q, k[:, :, a:b], v[:, :, a:b], None if bias is None else bias[..., a:b], Dh ** -0.5))
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (merge.out - ref).abs().max() < tol
    grads = [kern.backward(dout.to(dtype), q, k[:, :, a:b], v[:, :, a:b], merge.out.to(dtype), merge.lse,
                           None if bias is None else bias[..., a:b], Dh ** -0.5) for a, b in cuts]
    assert (sum(g[0].float() for g in grads) - ref_in[0].grad).abs().max() < tol * 10
    assert (torch.cat([g[1].float() for g in grads], 2) - ref_in[1].grad).abs().max() < tol * 10
