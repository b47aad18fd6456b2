"""Ring and USP (Ulysses x ring) attention ops, for self-attention on a sequence sharded over the SP
group and for joint attention (text replicated, video sharded); the op interface is the one of
``ulysses.py``, the ring itself is ``ring.py``.

USP (Fang & Zhao, "USP: A Unified Sequence Parallelism Approach for Long Context Generative AI", 2024):
the SP group of P ranks is a grid of ``ring_size`` (R) rings x ``ulysses_size = P / R`` (U) Ulysses
groups. Ulysses groups are runs of U consecutive SP ranks (keep them inside a node: their all-to-alls
cannot overlap compute) and rings stride across them (their transfers hide under the block compute).
A Ulysses all-to-all turns ``[B, N/P, H, Dh]`` into ``[B, N/R, H/U, Dh]``: the concatenated shards of
the Ulysses group, i.e. the contiguous super-block ``ring_rank`` of the padded sequence, for this rank's
``H/U`` heads; the ring attends that across the R super-blocks; a second all-to-all restores sequence
sharding. ``R == P`` is plain ring attention (no head constraint: 2 heads at sp 4 works); ``R == 1``
is Ulysses (``sequence_parallel.py`` then builds the Ulysses ops, which run the backend's own kernel).

Padding: the split pads N to a multiple of P at the end, so only the last blocks hold padding; their
valid lengths come from ``SequenceParallelState.seq_len`` and the ring never computes on padded keys or
queries (outputs there are 0, as the Ulysses op gives).

Masks (self-attention): None, or bool (True = attend) / additive float over the whole unpadded
sequence, ``[B|1, 1|H, 1|N, N]``; each ring step uses the block's slice (and this rank's heads). A
full ``[.., N, N]`` mask is O(N^2) on every rank: fine for short sequences; long ones should use key
masks ``[B, 1, 1, N]``.

Joint attention (``RingJointAttentionOp`` / ``USPJointAttentionOp``, layout of ``joint.py``): the text
part is cut to this rank's Ulysses heads; video queries attend the text keys once (an extra local
block) and the video keys around the ring; text queries attend the text keys and every video key
(``ReplicatedQueryAttention``: own block + all-gathered partials, bit-identical on every rank); the
text output is all-gathered over the Ulysses heads (backward: reduce-scatter SUM).

The ring runs its own log-sum-exp block kernels (``ring_kernels.py``: aten's CPU flash kernel, CUDA
flash/memory-efficient, fp32 math fallback); ``inner`` is kept for the report and for ``R == 1``.
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from opendit_lite.models.layers.attention import AttentionOp

from .comm import all_to_all, group_rank, group_size
from .joint import gather_text_heads, heads_of, split_joint
from .modes import usp_heads_error
from .ring import ReplicatedQueryAttention, RingAttention, RingPlan
from .sequence import SequenceParallelState
from .ulysses import SequenceParallelOp, check_sequence_mask

# ----------------------------------------------------------------------------------------------
# groups
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class USPGroups:
    """This rank's ring and Ulysses groups inside its SP group (a group of one rank is None)."""

    ring_group: Optional[dist.ProcessGroup]
    ring_size: int
    ring_rank: int
    ulysses_group: Optional[dist.ProcessGroup]
    ulysses_size: int
    ulysses_rank: int

    @staticmethod
    def ring_only(sp_group: Optional[dist.ProcessGroup]) -> "USPGroups":
        """Ring attention over the whole SP group (no Ulysses stage)."""
        return USPGroups(sp_group, group_size(sp_group), group_rank(sp_group), None, 1, 0)

    def __deepcopy__(self, memo):  # process groups are communicator handles: a copied model shares them
        return self


_GROUP_CACHE: Dict[Tuple[Tuple[int, ...], int], USPGroups] = {}


def usp_layout(sp_ranks: List[int], ring_size: int):
    """(Ulysses groups, rings) of one SP group given as global ranks in SP-rank order: Ulysses groups
    are runs of ``P / ring_size`` consecutive SP ranks, ring i takes the i-th rank of each run."""
    ulysses_size = len(sp_ranks) // ring_size
    ulysses = [tuple(sp_ranks[c * ulysses_size:(c + 1) * ulysses_size]) for c in range(ring_size)]
    rings = [tuple(sp_ranks[i::ulysses_size]) for i in range(ulysses_size)]
    return ulysses, rings


def build_usp_groups(sp_group: Optional[dist.ProcessGroup], ring_size: int) -> USPGroups:
    """This rank's USP groups. Collective over the *world*: every rank must call it, in the same order
    (``dist.new_group`` is collective); one ``all_gather_object`` tells every rank every SP group's ranks,
    so it works for any data x sequence layout. Cached per (SP ranks, ring_size): converting a second
    model (an EMA copy, the sampler's model) reuses the groups."""
    sp_ranks = tuple(dist.get_process_group_ranks(sp_group or dist.group.WORLD))
    sp_size = len(sp_ranks)
    if ring_size < 1 or sp_size % ring_size:
        raise ValueError(f"sp_ring_size={ring_size} must divide sp_size={sp_size} (the Ulysses degree is "
                         f"sp_size / sp_ring_size)")
    key = (sp_ranks, ring_size)
    if key in _GROUP_CACHE:
        return _GROUP_CACHE[key]
    every: List[Optional[Tuple[int, ...]]] = [None] * dist.get_world_size()
    dist.all_gather_object(every, sp_ranks)
    me = dist.get_rank()
    mine = {}
    for ranks in sorted(set(every)):                 # the same order of new_group calls on every rank
        ulysses, rings = usp_layout(list(ranks), ring_size)
        for kind, members in [("ulysses", m) for m in ulysses] + [("ring", m) for m in rings]:
            group = dist.new_group(list(members)) if len(members) > 1 else None
            if me in members:
                mine[kind] = (group, len(members), members.index(me))
    result = USPGroups(*mine["ring"], *mine["ulysses"])
    _GROUP_CACHE[key] = result
    return result


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return mask.to(dtype)


# ----------------------------------------------------------------------------------------------
# ops
# ----------------------------------------------------------------------------------------------

class USPAttentionOp(SequenceParallelOp):
    """USP self-attention over ``state.group``: q, k, v ``[B, N/P, H, Dh]`` -> ``[B, N/P, H, Dh]``.

    ``groups``: ``build_usp_groups(state.group, ring_size)``; ``kernel``: "auto" or a name of
    ``ring_kernels.KERNELS``; ``overlap``: post the next block's transfer before computing the current
    one (False: after, for timing comparisons); ``trace``: set to a list to record the ring's
    post/compute/wait events (the overlap test).
    """

    mode = "usp"

    def __init__(self, inner: AttentionOp, state: SequenceParallelState, groups: USPGroups,
                 kernel: str = "auto", overlap: bool = True):
        super().__init__(inner, state)
        if groups.ring_size * groups.ulysses_size != state.size:
            raise ValueError(f"ring {groups.ring_size} x Ulysses {groups.ulysses_size} != sp_size {state.size}")
        self.groups, self.kernel, self.overlap = groups, kernel, overlap
        self.trace: Optional[list] = None

    @property
    def backend(self) -> str:
        return f"{self.mode}{'-joint' if self.role == 'joint' else ''}+{self.inner.backend}"

    def extra_repr(self) -> str:
        return f"sp_size={self.state.size}, ring={self.groups.ring_size}, ulysses={self.groups.ulysses_size}"

    # -- shared steps ------------------------------------------------------------------------------

    def _check_heads(self, num_heads: int) -> None:
        if num_heads % self.groups.ulysses_size:
            raise usp_heads_error(num_heads, self.state.size, self.groups.ring_size)

    def _to_ring(self, x: torch.Tensor) -> torch.Tensor:
        """[S, B, N/P, H, Dh] stacked tensors -> [S, B, H/U, N/R, Dh] (the Ulysses all-to-all)."""
        if self.groups.ulysses_size > 1:  # (a group of one rank is None, which would mean the world)
            x = all_to_all(x, self.groups.ulysses_group, scatter_dim=3, gather_dim=2)    # [S, B, N/R, H/U, Dh]
        return x.transpose(2, 3)

    def _from_ring(self, out: torch.Tensor) -> torch.Tensor:
        """[B, H/U, N/R, Dh] -> [B, N/P, H, Dh]."""
        out = out.transpose(1, 2)
        if self.groups.ulysses_size == 1:
            return out
        return all_to_all(out, self.groups.ulysses_group, scatter_dim=1, gather_dim=2)

    def _plan(self, block: int, head_dim: int, num_heads: int, full_mask=None, extra_bias=None,
              dtype=torch.float32) -> RingPlan:
        g, seq_len = self.groups, self.state.require_seq_len()

        def valid(j):                                  # real tokens of super-block j (the last ones: padding)
            return max(0, min(block, seq_len - j * block))

        def start(j):
            return min(j * block, seq_len)

        rows = valid(g.ring_rank)
        bias = None
        if full_mask is not None:
            check_sequence_mask(full_mask, num_heads, seq_len, type(self).__name__)
            mask = heads_of(full_mask, g.ulysses_rank, num_heads // g.ulysses_size, dim=1)
            if mask.size(2) > 1:                                                   # this rank's query rows
                mask = mask.narrow(2, start(g.ring_rank), rows)
            bias = _additive(mask, dtype)
        return RingPlan(group=g.ring_group, rank=g.ring_rank, size=g.ring_size, scale=1.0 / math.sqrt(head_dim),
                        q_valid=rows, k_valid=[valid(j) for j in range(g.ring_size)],
                        bias=(lambda j: None) if bias is None else (lambda j: bias.narrow(3, start(j), valid(j))),
                        extra_bias=extra_bias, kernel=self.kernel, overlap=self.overlap, trace=self.trace)

    def _check_shard(self, local_tokens: int) -> None:
        padded = self.state.padded_len()
        if local_tokens * self.state.size != padded:
            raise ValueError(f"{type(self).__name__} got {local_tokens} tokens per rank but the model's split "
                             f"sharded {self.state.seq_len} tokens ({padded} padded over {self.state.size} ranks): "
                             f"this op attends along an axis that is not the sharded one")

    # -- self-attention ------------------------------------------------------------------------------

    def forward(self, q, k, v, attn_mask=None):
        num_heads, head_dim = q.size(2), q.size(3)
        self._check_heads(num_heads)
        self._check_shard(q.size(1))
        qh, kh, vh = self._to_ring(torch.stack((q, k, v))).unbind(0)           # [B, H/U, N/R, Dh]
        plan = self._plan(qh.size(2), head_dim, num_heads, attn_mask, dtype=q.dtype)
        out = RingAttention.apply(qh, kh, vh, None, None, plan)                 # [B, H/U, N/R, Dh]
        return self._from_ring(out)                                             # [B, N/P, H, Dh]


class RingAttentionOp(USPAttentionOp):
    """Ring self-attention over the whole SP group (USP with ``ring_size = sp_size``)."""

    mode = "ring"

    def __init__(self, inner: AttentionOp, state: SequenceParallelState, kernel: str = "auto",
                 overlap: bool = True):
        super().__init__(inner, state, USPGroups.ring_only(state.group), kernel, overlap)


class USPJointAttentionOp(USPAttentionOp):
    """USP attention over ``[text (replicated); video (sequence-sharded)]`` (``joint.py``)."""

    role = "joint"

    def forward(self, q, k, v, attn_mask=None):
        num_heads, head_dim = q.size(2), q.size(3)
        self._check_heads(num_heads)
        parts = split_joint(type(self).__name__, q, k, v, attn_mask, self.state.padded_len() // self.state.size)
        g = self.groups
        heads = num_heads // g.ulysses_size

        def mine(t: torch.Tensor) -> torch.Tensor:                                   # [B, H/U, M, Dh]
            return heads_of(t, g.ulysses_rank, heads).transpose(1, 2)

        tq, tk, tv = mine(parts.text_q), mine(parts.text_k), mine(parts.text_v)
        text_bias = None
        if parts.text_mask is not None and tk.size(2):
            text_bias = _additive(heads_of(parts.text_mask, g.ulysses_rank, heads, dim=1), q.dtype)  # [B|1, 1|h, 1, M]
        qh, kh, vh = self._to_ring(parts.video).unbind(0)                            # [B, H/U, N/R, Dh]
        plan = self._plan(qh.size(2), head_dim, num_heads, None, extra_bias=text_bias, dtype=q.dtype)
        extra = (tk, tv) if tk.size(2) else (None, None)
        video_out = self._from_ring(RingAttention.apply(qh, kh, vh, *extra, plan))   # [B, N/P, H, Dh]
        if not tq.size(2):
            return video_out
        text_out = ReplicatedQueryAttention.apply(tq, tk, tv, kh, vh, plan)          # [B, H/U, Mq, Dh]
        text_out = text_out.transpose(1, 2)                                           # [B, Mq, H/U, Dh]
        if g.ulysses_size > 1:
            text_out = gather_text_heads(text_out, g.ulysses_group)                   # [B, Mq, H, Dh]
        return torch.cat([text_out, video_out], dim=1)


class RingJointAttentionOp(USPJointAttentionOp):
    """Joint attention with a plain ring over the whole SP group."""

    mode = "ring"

    def __init__(self, inner: AttentionOp, state: SequenceParallelState, kernel: str = "auto",
                 overlap: bool = True):
        super().__init__(inner, state, USPGroups.ring_only(state.group), kernel, overlap)
