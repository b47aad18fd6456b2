"""Ring attention over a process group: forward and a hand-written backward, with the next key/value
block in flight while the current one is computed.

Why our own ring rather than torch's or diffusers' (measured with torch 2.15 and diffusers 0.42 on CPU
gloo, fp32, driving each implementation directly):

* torch ``context_parallel``: intercepts only the CUDA flash / memory-efficient / cuDNN SDPA ops. On
  CPU the SDPA call falls back to DTensor's replicate rule (two all-gathers of K and V, no ring), and
  backward stops (``NotImplementedError``: no sharding strategy for the CPU flash backward). Its ring
  versions of the efficient and cuDNN ops refuse ``attn_bias``.
* torch's ``_templated_ring_attention`` (and its backward, private and moved between releases): exact
  at 2 and 4 ranks when driven by a block op that returns the log-sum-exp and wrapped in an autograd
  function of ours, and it overlaps (the next block's async permute is issued before the op call).
  But it needs a process-global switch (``_cp_options.enable_load_balance = False``, else "Load
  balancing requires is_causal=True"), passes the *same* mask to every key block (a key-padding mask
  over the whole sequence gives errors of 0.6-1.4), knows no padding (uneven token counts would let
  padded keys attend), no keys attended once (joint attention's replicated text) and no Ulysses stage.
* diffusers' ``TemplatedRingAttention``: not a ring in forward (K/V are all-gathered once: the whole
  K/V in memory on every rank, no transfer/compute overlap); its backward is wrong at ring degree 4
  (dK/dV errors of about 1: the gradient accumulator travels to rank+1 while blocks are visited in the
  order rank+1, rank+2, ...); its own CPU ops cannot run it (native SDPA refuses ``return_lse``,
  native flash has no CPU kernel); the same mask goes to every step; the padding variant
  (``ring_anything``) has no backward; and ``enable_parallelism`` divides by the accelerator count.

So this is the smallest ring that trains, on gloo and NCCL, with padding, masks and overlap, on top of
aten's block kernels that return the log-sum-exp (``ring_kernels.py``).

Algorithm. Rank ``r`` of a ring of ``R`` holds query block ``r`` and key/value block ``r``. Step ``s``
attends its queries to key block ``j = r - s`` (mod R) while block ``j - 1`` travels from the previous
rank, and merges the block's (out, lse) into running fp32 accumulators (``LseMerge``). Backward is the
same loop with the final out/lse: dQ accumulates locally; each block's dK/dV partial is added to an
fp32 accumulator that travels one hop per step behind its block and, after R hops, lands on the
block's owner. Only q, k, v, out and lse are saved (O(N/R) per rank); autograd through the steps
would keep every visited K/V block (the whole K/V, as all-gather does) and need differentiable P2P.

Overlap. At each step ``RingExchange.start`` posts ``batch_isend_irecv`` (send the current block to
rank+1, receive the next from rank-1) *before* the current block is computed, and ``wait`` comes after
the compute. With NCCL the P2P runs on NCCL's stream and ``wait`` only makes the compute stream wait,
so the transfer of block ``j - 1`` runs under the attention of block ``j``; with gloo the same code
moves the bytes on gloo's threads (the CPU tests check the order post -> compute -> wait of every step
through ``RingPlan.trace``). In backward: post the next K/V block, compute this block's backward, wait
for the dK/dV accumulator of the previous rank and add to it, send it on (async), wait for the K/V
block. ``overlap=False`` posts after the compute instead (for timing comparisons; bitwise the same).

Padding and masks. Blocks have fixed padded sizes for the transfers, but only their valid rows and
keys are computed (``RingPlan.q_valid``, ``k_valid``): padded keys never take part, padded query rows
output zeros, and a block with nothing valid costs nothing. A mask over the whole sequence is cut per
block (``RingPlan.bias``). Keys attended once (joint attention's replicated text) are an extra local
block. Query rows with no allowed key output 0 (as SDPA does).
"""

from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .comm import all_gather_stacked
from .ring_kernels import acc_dtype, select_kernel

NEG_INF = float("-inf")
KV_TAG, DKV_TAG = 11, 12


# ----------------------------------------------------------------------------------------------
# point-to-point exchange with the ring neighbours
# ----------------------------------------------------------------------------------------------

class _InFlight:
    """A posted send/receive pair; ``wait()`` returns the received tensor. The sent tensor stays
    referenced until then (the transfer reads it)."""

    def __init__(self, works, received, sent, trace, label):
        self.works, self.received, self._sent, self.trace, self.label = works, received, sent, trace, label

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        if self.trace is not None:
            self.trace.append(("wait", self.label))
        return self.received


class RingExchange:
    """Send a tensor to the next rank of the ring and receive the previous rank's, asynchronously."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int, tag: int, trace: Optional[list] = None):
        self.group, self.tag, self.trace = group, tag, trace
        self.next = dist.get_global_rank(group, (rank + 1) % size)
        self.prev = dist.get_global_rank(group, (rank - 1) % size)

    def start(self, tensor: torch.Tensor, label=None) -> _InFlight:
        tensor = tensor.contiguous()
        received = torch.empty_like(tensor)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, tensor, self.next, self.group, self.tag),
            dist.P2POp(dist.irecv, received, self.prev, self.group, self.tag),
        ])
        if self.trace is not None:
            self.trace.append(("post", label))
        return _InFlight(works, received, tensor, self.trace, label)


# ----------------------------------------------------------------------------------------------
# what one call of the ring needs to know
# ----------------------------------------------------------------------------------------------

@dataclass
class RingPlan:
    """Fixed facts of one ring attention call (kept in the autograd context for backward).

    ``q_valid``: valid query rows of this rank's block; ``k_valid[j]``: valid keys of block j;
    ``bias(j)``: additive mask for (this rank's valid rows, block j's valid keys) or None;
    ``extra_bias``: mask of the extra (attend-once) key block, broadcast over rows, or None;
    ``trace``: a list to record ("post" | "compute" | "wait", label) events in, or None.
    """

    group: Optional[dist.ProcessGroup]
    rank: int
    size: int
    scale: float
    q_valid: int
    k_valid: List[int]
    bias: Callable[[int], Optional[torch.Tensor]] = lambda j: None
    extra_bias: Optional[torch.Tensor] = None
    kernel: str = "auto"
    overlap: bool = True
    trace: Optional[list] = field(default=None, repr=False)

    def exchange(self, tag: int) -> Optional[RingExchange]:
        """None for a ring of one rank (USP with ring degree 1 is Ulysses)."""
        return RingExchange(self.group, self.rank, self.size, tag, self.trace) if self.size > 1 else None

    def log(self, what: str, label) -> None:
        if self.trace is not None:
            self.trace.append((what, label))


def block_forward(plan: RingPlan, q, k, v, bias):
    """(out, lse) of one block; rows with no allowed key get lse = -inf and out = 0."""
    out, lse = select_kernel(q, bias, plan.kernel).forward(q, k, v, bias, plan.scale)
    if bias is not None:
        has_key = (bias > NEG_INF).any(-1)                                       # [B|1, H|1, nq|1]
        if not bool(has_key.all()):
            lse = lse.masked_fill(~has_key, NEG_INF)
            out = out.masked_fill(~has_key.unsqueeze(-1), 0.0)
    return out, lse


def block_backward(plan: RingPlan, dout, q, k, v, out, lse_safe, bias):
    return select_kernel(q, bias, plan.kernel).backward(dout, q, k, v, out, lse_safe, bias, plan.scale)


class LseMerge:
    """Running softmax merge of block results in fp32: ``out = sum_b exp(lse_b - lse) out_b``."""

    def __init__(self):
        self.out: Optional[torch.Tensor] = None
        self.lse: Optional[torch.Tensor] = None

    def add(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        t = acc_dtype(out.dtype)
        out, lse = out.to(t), lse.to(t)
        if self.out is None:
            self.out, self.lse = out, lse
            return
        total = torch.logaddexp(self.lse, lse)
        safe = total.masked_fill(total == NEG_INF, 0.0)                          # rows with no key yet
        self.out = self.out * torch.exp(self.lse - safe).unsqueeze(-1) + out * torch.exp(lse - safe).unsqueeze(-1)
        self.lse = total

    def result(self, like: torch.Tensor, rows: int):
        """(out, lse) so far; zeros and -inf when nothing was attended (every key padding or masked)."""
        if self.out is None:
            shape = like.shape[:2] + (rows,)
            t = acc_dtype(like.dtype)
            return like.new_zeros(shape + like.shape[3:], dtype=t), like.new_full(shape, NEG_INF, dtype=t)
        return self.out, self.lse


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    extra = rows - x.size(2)
    return x if extra == 0 else F.pad(x, (0, 0, 0, extra))


# ----------------------------------------------------------------------------------------------
# the ring: this rank's queries against every rank's key/value block (+ an attend-once block)
# ----------------------------------------------------------------------------------------------

class RingAttention(torch.autograd.Function):
    """q ``[B, H, nq, Dh]``; k, v ``[B, H, nk, Dh]`` (the same shapes on every rank of the ring);
    extra_k/extra_v: None or ``[B, H, M, Dh]`` keys every query attends once (local); returns
    ``[B, H, nq, Dh]`` with zeros in padded rows."""

    @staticmethod
    def forward(ctx, q, k, v, extra_k, extra_v, plan: RingPlan):
        rank, size, rows = plan.rank, plan.size, plan.q_valid
        q_in = q[:, :, :rows]
        merge = LseMerge()
        kv = torch.stack((k, v))                                                  # [2, B, H, nk, Dh]
        ring = plan.exchange(KV_TAG)
        for step in range(size):
            j = (rank - step) % size
            flight = None
            if step < size - 1 and plan.overlap:
                flight = ring.start(kv, label=("fwd", step))                      # block j-1, in flight
            if step == 0 and extra_k is not None and rows:                        # attend-once keys
                merge.add(*block_forward(plan, q_in, extra_k, extra_v, plan.extra_bias))
            if rows and plan.k_valid[j]:
                plan.log("compute", ("fwd", step))
                keys = plan.k_valid[j]
                merge.add(*block_forward(plan, q_in, kv[0, :, :, :keys], kv[1, :, :, :keys], plan.bias(j)))
            if step < size - 1:
                kv = (flight or ring.start(kv, label=("fwd", step))).wait()
        out, lse = merge.result(q, rows)                                          # fp32 [B, H, rows, Dh], [B, H, rows]
        out = out.to(q.dtype)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, extra_k, extra_v, out, lse)
        return _pad_rows(out, q.size(2))

    @staticmethod
    def backward(ctx, grad):
        q, k, v, extra_k, extra_v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        rank, size, rows = plan.rank, plan.size, plan.q_valid
        q_in, dout = q[:, :, :rows], grad[:, :, :rows]
        lse_safe = lse.masked_fill(lse == NEG_INF, 0.0)
        dq = torch.zeros(q_in.shape, dtype=acc_dtype(q.dtype), device=q.device)
        d_extra_k = d_extra_v = None
        if extra_k is not None:
            d_extra_k, d_extra_v = torch.zeros_like(extra_k), torch.zeros_like(extra_v)
        kv = torch.stack((k, v))
        kv_ring, dkv_ring = plan.exchange(KV_TAG), plan.exchange(DKV_TAG)
        dkv_flight = None
        for step in range(size):
            j = (rank - step) % size
            kv_flight = None
            if step < size - 1 and plan.overlap:
                kv_flight = kv_ring.start(kv, label=("bwd", step))
            if step == 0 and extra_k is not None and rows:                        # attend-once keys
                dq_e, dk_e, dv_e = block_backward(plan, dout, q_in, extra_k, extra_v, out, lse_safe, plan.extra_bias)
                dq += dq_e
                d_extra_k, d_extra_v = dk_e.to(extra_k.dtype), dv_e.to(extra_v.dtype)
            part = torch.zeros(kv.shape, dtype=acc_dtype(kv.dtype), device=kv.device)   # dK, dV of block j
            if rows and plan.k_valid[j]:
                plan.log("compute", ("bwd", step))
                keys = plan.k_valid[j]
                dq_b, dk_b, dv_b = block_backward(plan, dout, q_in, kv[0, :, :, :keys], kv[1, :, :, :keys], out,
                                                  lse_safe, plan.bias(j))
                dq += dq_b
                part[0, :, :, :keys] = dk_b
                part[1, :, :, :keys] = dv_b
            if dkv_flight is not None:
                part += dkv_flight.wait()      # block j's accumulator, from the rank that held j last step
            if size > 1:
                dkv_flight = dkv_ring.start(part, label=("bwd-dkv", step))        # on to the next holder
            if step < size - 1:
                kv = (kv_flight or kv_ring.start(kv, label=("bwd", step))).wait()
        dkv = dkv_flight.wait() if size > 1 else part                             # our own block, complete
        dq = _pad_rows(dq, q.size(2)).to(q.dtype)
        return dq, dkv[0].to(k.dtype), dkv[1].to(v.dtype), d_extra_k, d_extra_v, None


# ----------------------------------------------------------------------------------------------
# replicated queries (joint attention's text): every rank of the ring holds the same queries
# ----------------------------------------------------------------------------------------------

class ReplicatedQueryAttention(torch.autograd.Function):
    """Queries held identically by every ring rank (text tokens) attending to the replicated text
    keys once and to every rank's key block.

    Each rank attends only to its own key block; the partial (out, lse) of every rank are all-gathered
    and merged in rank order, so the output is bit-identical on every rank and the per-rank cost is
    ``Mq * (N/R + M)`` instead of ``Mq * (N + M)``. Backward: each rank's own block gets the sum over
    ranks of the output gradient (one all-reduce), the text block this rank's own gradient, both with
    the merged out/lse: the exact adjoint of the forward under the package's gradient convention.

    tq ``[B, H, Mq, Dh]``; tk, tv ``[B, H, M, Dh]``; k, v this rank's block ``[B, H, nk, Dh]``;
    returns ``[B, H, Mq, Dh]``.
    """

    @staticmethod
    def forward(ctx, tq, tk, tv, k, v, plan: RingPlan):
        acc = acc_dtype(tq.dtype)
        own = plan.k_valid[plan.rank]
        if own:
            part_out, part_lse = block_forward(plan, tq, k[:, :, :own], v[:, :, :own], None)
        else:
            part_out, part_lse = tq.new_zeros(tq.shape), tq.new_full(tq.shape[:3], NEG_INF, dtype=acc)
        packed = torch.cat((part_out.to(acc), part_lse.to(acc).unsqueeze(-1)), dim=-1)   # [B, H, Mq, Dh+1]
        every = all_gather_stacked(packed, plan.group) if plan.size > 1 else packed[None]  # [R, B, H, Mq, Dh+1]
        merge = LseMerge()
        if tk.size(2):
            merge.add(*block_forward(plan, tq, tk, tv, plan.extra_bias))
        for r in range(plan.size):
            merge.add(every[r, ..., :-1], every[r, ..., -1])
        out, lse = merge.out.to(tq.dtype), merge.lse
        ctx.plan = plan
        ctx.save_for_backward(tq, tk, tv, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        tq, tk, tv, k, v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        lse_safe = lse.masked_fill(lse == NEG_INF, 0.0)
        total = grad.to(acc_dtype(grad.dtype)).contiguous().clone()
        if plan.size > 1:
            dist.all_reduce(total, group=plan.group)                                    # sum over the ring
        dtq = torch.zeros(tq.shape, dtype=acc_dtype(tq.dtype), device=tq.device)
        dtk, dtv = torch.zeros_like(tk), torch.zeros_like(tv)
        if tk.size(2):
            g_q, g_k, g_v = block_backward(plan, grad, tq, tk, tv, out, lse_safe, plan.extra_bias)
            dtq += g_q
            dtk, dtv = g_k.to(tk.dtype), g_v.to(tv.dtype)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        own = plan.k_valid[plan.rank]
        if own:
            g_q, g_k, g_v = block_backward(plan, total, tq, k[:, :, :own], v[:, :, :own], out, lse_safe, None)
            dtq += g_q
            dk[:, :, :own], dv[:, :, :own] = g_k.to(k.dtype), g_v.to(v.dtype)
        return dtq.to(tq.dtype), dtk, dtv, dk, dv, None
