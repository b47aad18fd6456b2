"""Sequence parallelism for the video models: the Ulysses entries of their attention types, the
Ulysses op for joint text-video attention, and DSP (dynamic sequence parallelism) for STDiT.

Both video models keep tokens as [B, T, S, D] and shard the S patches of each frame (their
``seq_split`` is on axis 2). Under Ulysses (``apply_sequence_parallel``) that means:

=====================  ===============================  ====================================
module type            attends over                     op under sequence parallelism
=====================  ===============================  ====================================
``SpatialAttention``   the S patches of a frame         ``UlyssesAttentionOp`` (via Attention)
``TemporalAttention``  the T frames at a patch          local (each rank has whole frames axes)
``CrossAttention``     replicated caption tokens        ``SequenceParallelCrossAttentionOp``
``JointAttention``     caption + the S patches          ``UlyssesJointAttentionOp`` (below)
=====================  ===============================  ====================================

Joint attention (``UlyssesJointAttentionOp``): q/k/v arrive as ``[text; video shard]``. The video
part goes through the usual all-to-all (all S patches, H/P heads); the text part, identical on every
rank, is cut to the same H/P heads locally, with no communication, and put in front, so the inner op
computes exactly the serial attention for those heads. Afterwards the video output returns to
sequence sharding with the reverse all-to-all and the text output, which each rank now holds for
its heads only, is all-gathered over heads. That gather's backward is a reduce-scatter SUM, which
keeps the gradient convention of ``comm.py`` (the SP-group mean of each rank's gradient is the
serial gradient).

DSP (Zhao et al., "DSP: Dynamic Sequence Parallelism for Multi-Dimensional Transformers", 2024):
rather than exchanging q/k/v and outputs around every attention whose axis is sharded (four
all-to-alls of the activations per spatial attention), re-shard the activations themselves so the
next attention runs along a whole local axis: STDiT's ``to_frames`` switch (before spatial
attention) makes each rank hold whole frames, its ``to_patches`` switch (before temporal
attention) whole frame sequences at a subset of patches. Two all-to-alls of [B, T, S, D] per block
and no attention op communicates; every attention head stays on every rank, so the head count
need not be divisible by the SP size. ``apply_dsp`` swaps the markers; attention ops stay serial.
"""

from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from opendit_lite.models.layers.axis_attention import TemporalAttention
from opendit_lite.models.layers.cross_attention import CrossAttention
from opendit_lite.models.layers.joint_attention import JointAttention
from opendit_lite.models.layers.sequence import SequenceGather, SequenceSplit
from opendit_lite.models.layers.sequence_switch import SequenceSwitch

from .comm import all_to_all, gather_sequence, pad_along, padded_length
from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState
from .sequence_parallel import register_sequence_parallel_attention
from .ulysses import SequenceParallelCrossAttentionOp, SequenceParallelOp


class UlyssesJointAttentionOp(SequenceParallelOp):
    """Ulysses attention over ``[text (replicated); video (sequence-sharded)]`` around ``inner``.

    k, v: ``[B, M + N/P, H, Dh]``, the first M tokens the caption (the same on every SP rank), the
    rest this rank's shard of the N video tokens; q: the same, or the video shard alone (a block
    whose caption stream has no queries); returns q's layout. M is not passed: it is what remains
    after the video shard, whose length the model's split recorded. ``attn_mask``: None or a key
    mask ``[B, 1, 1, M + N/P]`` whose video part is all True (caption padding, as JointAttention
    builds it); its caption part is kept and the video part rebuilt for the full sequence.
    """

    @property
    def backend(self) -> str:
        return f"ulysses-joint+{self.inner.backend}"

    def forward(self, q, k, v, attn_mask=None):
        if attn_mask is not None and (attn_mask.dim() != 4 or attn_mask.size(-2) != 1 or attn_mask.size(-3) != 1
                                      or attn_mask.size(-1) != k.size(1) or attn_mask.dtype != torch.bool):
            raise ValueError(f"UlyssesJointAttentionOp takes only a boolean key mask [B, 1, 1, M + N/P] over "
                             f"[caption; video shard] (caption padding), got {tuple(attn_mask.shape)}")
        state = self.state
        num_heads = q.size(2)
        if num_heads % state.size != 0:
            raise ValueError(f"Ulysses joint attention shards heads: num_heads={num_heads} is not divisible "
                             f"by sp_size={state.size}; use an sp_size that divides {num_heads}")
        seq_len, padded = state.require_seq_len(), state.padded_len()
        local = padded // state.size
        if min(q.size(1), k.size(1)) < local or k.size(1) != v.size(1):
            raise ValueError(f"joint attention got q/k/v of {q.size(1)}/{k.size(1)}/{v.size(1)} tokens but the "
                             f"video shard alone has {local}: pass [text; video shard] along the sequence")
        # The caption part of q may be empty (a context_pre_only block has no caption queries).
        text_q, text_kv = q.size(1) - local, k.size(1) - local
        video = torch.stack((q[:, text_q:], k[:, text_kv:], v[:, text_kv:]))        # [3, B, N/P, H, Dh]
        video = all_to_all(video, state.group, scatter_dim=3, gather_dim=2)         # [3, B, Np, H/P, Dh]
        video = video[:, :, :seq_len]                                               # [3, B, N, H/P, Dh]
        heads = num_heads // state.size

        def mine(text: torch.Tensor) -> torch.Tensor:                               # this rank's heads
            return text.narrow(2, state.rank * heads, heads)

        q = torch.cat([mine(q[:, :text_q]), video[0]], dim=1)                       # [B, Mq + N, H/P, Dh]
        k = torch.cat([mine(k[:, :text_kv]), video[1]], dim=1)                      # [B, M + N, H/P, Dh]
        v = torch.cat([mine(v[:, :text_kv]), video[2]], dim=1)
        if attn_mask is not None:  # the caption part as given, every video key of the full sequence
            video_keys = attn_mask.new_ones(*attn_mask.shape[:-1], seq_len)
            attn_mask = torch.cat([attn_mask[..., :text_kv], video_keys], dim=-1)    # [B, 1, 1, M + N]
        out = self.inner(q, k, v, attn_mask=attn_mask)                              # [B, Mq + N, H/P, Dh]
        text_out, video_out = out.split([text_q, seq_len], dim=1)
        video_out = pad_along(video_out, 1, padded)                                 # [B, Np, H/P, Dh]
        video_out = all_to_all(video_out, state.group, scatter_dim=1, gather_dim=2)  # [B, N/P, H, Dh]
        if not text_q:
            return video_out
        text_out = gather_sequence(text_out, state.group, dim=2)                    # [B, Mq, H, Dh]
        return torch.cat([text_out, video_out], dim=1)                              # [B, Mq + N/P, H, Dh]


# SpatialAttention is an Attention and inherits its UlyssesAttentionOp entry.
register_sequence_parallel_attention(TemporalAttention, None)
register_sequence_parallel_attention(CrossAttention, SequenceParallelCrossAttentionOp)
register_sequence_parallel_attention(JointAttention, UlyssesJointAttentionOp)


# ----------------------------------------------------------------------------------------------
# DSP
# ----------------------------------------------------------------------------------------------

class DSPState(SequenceParallelState):
    """Adds the true (unpadded) length of every axis that has been sharded, keyed by axis, so a
    switch can drop the padding of the axis it gathers whole."""

    def __init__(self, group: Optional[dist.ProcessGroup]):
        super().__init__(group)
        self.lengths: Dict[int, int] = {}


class DSPSplit(SequenceParallelSplit):
    """``SequenceParallelSplit`` that also records the split axis' length for the switches."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.lengths[self.dim] = x.size(self.dim)
        return super().forward(x)


class DSPSwitch(nn.Module):
    """One all-to-all: ``x`` sharded along ``gather_dim`` -> sharded along ``scatter_dim``.

    The axis being scattered is whole here, so its length is recorded and it is padded to a
    multiple of the SP size; the axis being gathered comes back padded and is cut to the length
    recorded when it was scattered.
    """

    def __init__(self, state: DSPState, scatter_dim: int, gather_dim: int):
        super().__init__()
        self.state = state
        self.scatter_dim = scatter_dim
        self.gather_dim = gather_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.state
        if self.gather_dim not in state.lengths:
            raise RuntimeError(f"DSP switch gathers axis {self.gather_dim}, which no split or earlier switch "
                               f"sharded; the model's SequenceSplit must shard that axis first")
        length = x.size(self.scatter_dim)
        state.lengths[self.scatter_dim] = length
        x = pad_along(x, self.scatter_dim, padded_length(length, state.size))
        x = all_to_all(x, state.group, scatter_dim=self.scatter_dim, gather_dim=self.gather_dim)
        return x.narrow(self.gather_dim, 0, state.lengths[self.gather_dim])

    def extra_repr(self) -> str:
        return f"scatter_dim={self.scatter_dim}, gather_dim={self.gather_dim}, sp_size={self.state.size}"


def apply_dsp(model: nn.Module, sp_group: Optional[dist.ProcessGroup]) -> nn.Module:
    """Make ``model`` DSP-parallel over ``sp_group`` in place and return it.

    Swaps the model's ``SequenceSplit``/``SequenceGather``/``SequenceSwitch`` markers; attention ops
    are left as they are, because the switches put each attention's axis whole on every rank. A
    group of one rank leaves the model untouched. A model without switches (or split/gather
    markers) is refused: DSP needs the model to say where its attention axes change.
    """
    state = DSPState(sp_group)
    if state.size == 1:
        return model
    markers = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, (SequenceSplit, SequenceGather, SequenceSwitch))]
    kinds = {kind: sum(isinstance(m, kind) for _, _, m in markers)
             for kind in (SequenceSplit, SequenceGather, SequenceSwitch)}
    if not all(kinds.values()):
        raise ValueError(f"{type(model).__qualname__} has {kinds[SequenceSplit]} SequenceSplit, "
                         f"{kinds[SequenceGather]} SequenceGather and {kinds[SequenceSwitch]} SequenceSwitch "
                         f"markers; DSP needs all three (STDiT has them; use Ulysses for other models)")
    for parent, name, marker in markers:
        if isinstance(marker, SequenceSplit):
            replacement = DSPSplit(state, dim=marker.dim)
        elif isinstance(marker, SequenceGather):
            replacement = SequenceParallelGather(state, dim=marker.dim)
        else:
            replacement = DSPSwitch(state, marker.scatter_dim, marker.gather_dim)
        parent.register_module(name, replacement)
    return model


__all__ = ["DSPState", "DSPSplit", "DSPSwitch", "UlyssesJointAttentionOp", "apply_dsp"]
