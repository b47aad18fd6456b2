"""Sequence-parallel attention ops: wrappers around whatever ``AttentionOp`` the backend conversion
chose (SDPA, flash-attn, ...), so the attention module and its projections stay unchanged.

Self-attention (``UlyssesAttentionOp``, DeepSpeed-Ulysses): each rank holds ``N/P`` tokens of
every head. One all-to-all re-shards q, k, v to all ``N`` tokens of ``H/P`` heads, the inner op
attends over the full sequence per head, and a second all-to-all restores the sequence sharding.
Per layer each rank sends ``3 * B*N*D/P`` (q, k, v) plus ``B*N*D/P`` (output) elements, (P-1)/P of
them leaving the rank, a volume that stays constant as P grows with N. Heads are the unit of
sharding, hence ``num_heads % sp_size == 0``.

Padding: when the split padded the sequence, the all-to-all reassembles ``ceil(N/P)*P`` tokens.
The padded tokens are cut off before the inner op and zeros put back after it, so they never act as
keys (and cost no compute) and any backend works, including those that take no mask.

Cross-attention (``SequenceParallelCrossAttentionOp``): queries come from the sharded token
sequence, keys and values from a context (text tokens) that every SP rank holds in full. Each query
attends independently of the others, so a rank's query shard attends to the replicated context with
all heads: no communication at all, and the same FLOPs per rank as sharding heads instead (which
would cost two all-to-alls of q and the output). Only a per-query mask needs sharding like the
queries.
"""

from typing import Optional

import torch

from opendit_lite.models.layers.attention import AttentionOp

from .comm import all_to_all, pad_along, split_sequence
from .sequence import SequenceParallelState


def _local_heads(attn_mask: Optional[torch.Tensor], num_heads: int,
                 state: SequenceParallelState) -> Optional[torch.Tensor]:
    """Keep this rank's heads of a ``[B, 1|H, Nq, Nk]`` mask (a head-broadcast mask is kept)."""
    if attn_mask is None or attn_mask.dim() < 3 or attn_mask.size(-3) == 1:
        return attn_mask
    if attn_mask.size(-3) != num_heads:
        raise ValueError(
            f"attention mask of shape {tuple(attn_mask.shape)} has {attn_mask.size(-3)} heads; "
            f"expected 1 (broadcast) or num_heads={num_heads}"
        )
    local = num_heads // state.size
    return attn_mask.narrow(-3, state.rank * local, local)


class SequenceParallelOp(AttentionOp):
    """Base of the ops that run an ``inner`` serial op on sequence-sharded tokens; the conversion
    recognises an already converted op by this class."""

    def __init__(self, inner: AttentionOp, state: SequenceParallelState):
        super().__init__()
        self.inner = inner
        self.state = state

    def extra_repr(self) -> str:
        return f"sp_size={self.state.size}"


class UlyssesAttentionOp(SequenceParallelOp):
    """Ulysses self-attention around ``inner``.

    q, k, v: ``[B, N/P, H, Dh]`` (this rank's sequence shard, same shape for all three);
    attn_mask: None or a mask over the full unpadded sequence ``[B|1, 1|H, N, N]``;
    returns ``[B, N/P, H, Dh]``.
    """

    @property
    def backend(self) -> str:
        return f"ulysses+{self.inner.backend}"

    def forward(self, q, k, v, attn_mask=None):
        state = self.state
        num_heads = q.size(2)
        if num_heads % state.size != 0:
            raise ValueError(
                f"Ulysses sequence parallelism shards attention heads across the SP group: "
                f"num_heads={num_heads} is not divisible by sp_size={state.size}. Use an sp_size "
                f"that divides {num_heads}."
            )
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
        q, k, v = qkv[:, :, :seq_len].unbind(0)                                # [B, N, H/P, Dh]
        out = self.inner(q, k, v, attn_mask=_local_heads(attn_mask, num_heads, state))
        out = pad_along(out, 1, padded)                                        # [B, Np, H/P, Dh]
        return all_to_all(out, state.group, scatter_dim=1, gather_dim=2)       # [B, N/P, H, Dh]


class SequenceParallelCrossAttentionOp(SequenceParallelOp):
    """Cross-attention of sequence-sharded queries to a replicated context, around ``inner``.

    q: ``[B, N/P, H, Dh]`` (this rank's shard); k, v: ``[B, M, H, Dh]`` (the same on every SP
    rank); attn_mask: None, a key mask ``[B|1, 1|H, 1, M]``, or a per-query mask over the full
    unpadded sequence ``[B|1, 1|H, N, M]`` (sharded here like the queries); returns ``[B, N/P, H, Dh]``.
    """

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
