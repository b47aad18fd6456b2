"""Sequence-parallel attention ops: the base every mode's op shares, Ulysses for self- and joint
attention, and the cross-attention op that every mode uses. They wrap whatever ``AttentionOp`` the
backend conversion chose (SDPA, flash-attn, ...), so the attention module and its projections stay
unchanged.

The op interface (all modes: ``ulysses.py``, ``usp.py``; roles: self, joint, cross)
------------------------------------------------------------------------------------
Every op is an ``AttentionOp``: ``op(q, k, v, attn_mask=None) -> out`` in ``[B, L, H, Dh]``, built as
``Op(inner, state)`` (USP adds its groups), where ``inner`` is the serial op it replaces and ``state``
the model's ``SequenceParallelState`` (group, and the unpadded length N its split records each forward).
P = sp_size, n = ceil(N / P) tokens per rank (the split pads N to n * P).

* self  (``UlyssesAttentionOp``, ``RingAttentionOp``, ``USPAttentionOp``): q, k, v ``[B, n, H, Dh]``, this
  rank's shard; mask None or over the whole unpadded sequence ``[B|1, 1|H, 1|N, N]``; out ``[B, n, H, Dh]``
  (zeros in padded rows).
* joint (``UlyssesJointAttentionOp``, ``RingJointAttentionOp``, ``USPJointAttentionOp``): replicated text
  first, then the video shard; see ``joint.py``.
* cross (``SequenceParallelCrossAttentionOp``, every mode): q ``[B, n, H, Dh]`` the shard, k/v
  ``[B, M, H, Dh]`` a context every rank holds whole; mask None, a key mask ``[B|1, 1|H, 1, M]`` or a
  per-query mask over the whole sequence ``[B|1, 1|H, N, M]``.

Ulysses self-attention (DeepSpeed-Ulysses): each rank holds ``N/P`` tokens of every head. One all-to-all
re-shards q, k, v to all ``N`` tokens of ``H/P`` heads, the inner op attends over the whole sequence per
head, and a second all-to-all restores the sequence sharding. Heads are the unit of sharding, hence
``num_heads % sp_size == 0`` (``modes.py`` names ring and usp when it does not hold).

Padding: when the split padded the sequence, the all-to-all reassembles ``ceil(N/P)*P`` tokens. The
padded tokens are cut off before the inner op and zeros put back after it, so they never act as keys
(and cost no compute) and any backend works, including those that take no mask.

Cross-attention: queries come from the sharded tokens, keys and values from a context (text tokens)
that every SP rank holds in full. Each query attends independently of the others, so a rank's query
shard attends to the replicated context with all heads: no communication at all, in every mode, and
the same FLOPs per rank as sharding heads (which would cost two all-to-alls). Only a per-query mask is
sharded like the queries.
"""

from typing import Optional

import torch

from opendit_lite.models.layers.attention import AttentionOp

from .comm import all_to_all, pad_along, split_sequence
from .joint import allow_all_like, gather_text_heads, heads_of, split_joint
from .modes import ulysses_heads_error
from .sequence import SequenceParallelState


def check_sequence_mask(mask: Optional[torch.Tensor], num_heads: int, seq_len: int, op_name: str) -> None:
    """A self-attention mask must cover the whole unpadded sequence: ``[B|1, 1|H, 1|N, N]``."""
    if mask is None:
        return
    if not (mask.dim() == 4 and mask.size(1) in (1, num_heads) and mask.size(2) in (1, seq_len)
            and mask.size(3) == seq_len):
        raise ValueError(f"{op_name} takes a mask over the whole unpadded sequence, [B|1, 1|H, 1|N, N] with "
                         f"H={num_heads}, N={seq_len}; got {tuple(mask.shape)}")


def ulysses_heads(num_heads: int, state: SequenceParallelState) -> int:
    """Heads per rank under Ulysses (H / P), or the error naming ring and usp when P does not divide H."""
    if num_heads % state.size != 0:
        raise ulysses_heads_error(num_heads, state.size)
    return num_heads // state.size


class SequenceParallelOp(AttentionOp):
    """Base of the ops that run on sequence-sharded tokens around an ``inner`` serial op; the
    conversion recognises an already converted op by this class."""

    role = "self"  # what it attends over: self | joint | cross (the roles of sequence_parallel.py)
    mode = "ulysses"

    def __init__(self, inner: AttentionOp, state: SequenceParallelState):
        super().__init__()
        self.inner = inner
        self.state = state

    def extra_repr(self) -> str:
        return f"sp_size={self.state.size}"


class UlyssesAttentionOp(SequenceParallelOp):
    """Ulysses self-attention around ``inner``: q, k, v ``[B, N/P, H, Dh]`` -> ``[B, N/P, H, Dh]``."""

    @property
    def backend(self) -> str:
        return f"ulysses+{self.inner.backend}"

    def forward(self, q, k, v, attn_mask=None):
        state = self.state
        num_heads = q.size(2)
        heads = ulysses_heads(num_heads, state)
        # One exchange for q, k and v together.
        qkv = torch.stack((q, k, v))                                           # [3, B, N/P, H, Dh]
        qkv = all_to_all(qkv, state.group, scatter_dim=3, gather_dim=2)        # [3, B, Np, H/P, Dh]
        padded, seq_len = qkv.size(2), state.require_seq_len()
        if padded != state.padded_len():
            raise ValueError(
                f"UlyssesAttentionOp received {q.size(1)} tokens per rank ({padded} in all) but the "
                f"model's SequenceParallelSplit sharded a sequence of {seq_len} tokens: this op "
                f"attends along an axis that is not the sharded one; keep it serial by registering its "
                f"module type with register_sequence_parallel_attention(type, None)"
            )
        check_sequence_mask(attn_mask, num_heads, seq_len, type(self).__name__)
        q, k, v = qkv[:, :, :seq_len].unbind(0)                                # [B, N, H/P, Dh]
        mask = heads_of(attn_mask, state.rank, heads, dim=1)
        out = self.inner(q, k, v, attn_mask=mask)                              # [B, N, H/P, Dh]
        out = pad_along(out, 1, padded)                                        # [B, Np, H/P, Dh]
        return all_to_all(out, state.group, scatter_dim=1, gather_dim=2)       # [B, N/P, H, Dh]


class UlyssesJointAttentionOp(SequenceParallelOp):
    """Ulysses attention over ``[text (replicated); video (sequence-sharded)]`` around ``inner``
    (the layout of ``joint.py``). The video part goes through the usual all-to-all (all N tokens, H/P
    heads); the text part is cut to the same H/P heads locally and put in front, so the inner op
    computes exactly the serial attention for those heads; the video output returns to sequence
    sharding with the reverse all-to-all, the text output is all-gathered over heads."""

    role = "joint"

    @property
    def backend(self) -> str:
        return f"ulysses-joint+{self.inner.backend}"

    def forward(self, q, k, v, attn_mask=None):
        state = self.state
        heads = ulysses_heads(q.size(2), state)
        seq_len, padded = state.require_seq_len(), state.padded_len()
        parts = split_joint(type(self).__name__, q, k, v, attn_mask, padded // state.size)
        video = all_to_all(parts.video, state.group, scatter_dim=3, gather_dim=2)  # [3, B, Np, H/P, Dh]
        video = video[:, :, :seq_len]                                              # [3, B, N, H/P, Dh]
        text_q, text_k, text_v = (heads_of(t, state.rank, heads) for t in (parts.text_q, parts.text_k, parts.text_v))
        q = torch.cat([text_q, video[0]], dim=1)                                   # [B, Mq + N, H/P, Dh]
        k = torch.cat([text_k, video[1]], dim=1)                                   # [B, M + N, H/P, Dh]
        v = torch.cat([text_v, video[2]], dim=1)
        mask = None
        if parts.text_mask is not None:  # the text part as given (this rank's heads), every video key allowed
            text_mask = heads_of(parts.text_mask, state.rank, heads, dim=1)
            mask = torch.cat([text_mask, allow_all_like(text_mask, seq_len)], dim=-1)   # [B|1, 1|h, 1, M + N]
        out = self.inner(q, k, v, attn_mask=mask)                                  # [B, Mq + N, H/P, Dh]
        text_out, video_out = out.split([text_q.size(1), seq_len], dim=1)
        video_out = pad_along(video_out, 1, padded)                                # [B, Np, H/P, Dh]
        video_out = all_to_all(video_out, state.group, scatter_dim=1, gather_dim=2)  # [B, N/P, H, Dh]
        if not text_q.size(1):
            return video_out
        return torch.cat([gather_text_heads(text_out, state.group), video_out], dim=1)  # [B, Mq + N/P, H, Dh]


class SequenceParallelCrossAttentionOp(SequenceParallelOp):
    """Cross-attention of sequence-sharded queries to a replicated context, around ``inner``, in every
    mode: q ``[B, N/P, H, Dh]``; k, v ``[B, M, H, Dh]`` (the same on every SP rank); attn_mask None, a
    key mask ``[B|1, 1|H, 1, M]``, or a per-query mask over the full unpadded sequence
    ``[B|1, 1|H, N, M]`` (sharded here like the queries); returns ``[B, N/P, H, Dh]``."""

    role = "cross"

    @property
    def backend(self) -> str:
        return f"sp-cross+{self.inner.backend}"

    def forward(self, q, k, v, attn_mask=None):
        if attn_mask is not None and attn_mask.dim() >= 2 and attn_mask.size(-2) != 1:
            seq_len = self.state.require_seq_len()
            if attn_mask.size(-2) != seq_len:
                raise ValueError(
                    f"cross-attention mask of shape {tuple(attn_mask.shape)} has {attn_mask.size(-2)} "
                    f"query rows; expected 1 (a key mask) or the full sequence length {seq_len}"
                )
            # Padded query rows may attend everywhere: a fully masked row would give NaNs that
            # leak into the key/value gradients even though the row itself is dropped.
            allow = True if attn_mask.dtype == torch.bool else 0.0
            attn_mask = split_sequence(attn_mask, self.state.group, dim=-2, pad_value=allow)
        return self.inner(q, k, v, attn_mask=attn_mask)                        # [B, N/P, H, Dh]
