"""The layout every joint-attention op takes, and the pieces the Ulysses, ring and USP joint ops share.

Joint attention (MMDiT: SD3, Flux, HunyuanVideo, CogVideoX, the Vchitect-style model) attends over
text and image/video tokens in one softmax. Under sequence parallelism the video tokens are sharded
and the text tokens replicated: every rank of the SP group holds the same text. The ops take

    q     [B, Mq + n, H, Dh]   text queries first (Mq = M, or 0 for a block whose text has no queries)
    k, v  [B, M + n, H, Dh]    text keys/values first, then this rank's n = ceil(N / P) video tokens
    mask  None, or a key mask [B|1, 1|H, 1, M + n] (bool: True = attend, or additive float) whose text
          part masks padded text tokens; its video part must allow every video key (the models build it
          so: text padding is what a joint key mask masks)

and return ``[B, Mq + n, H, Dh]``: the text output, identical on every rank, then this rank's video
output. M is not passed: it is what remains after the video shard, whose length the model's split
recorded (``SequenceParallelState``). A family whose text comes after the image tokens (SD3,
HunyuanVideo) is reordered to text-first before the op and back after it (attention is equivariant
to that permutation).

The text is never exchanged: each rank cuts the text q/k/v to the heads it attends for (its Ulysses
heads) locally, and the text output, which each rank then holds for those heads only, is all-gathered
over heads; that gather's backward is a reduce-scatter SUM, which keeps the gradient convention of
``comm.py`` (the SP-group mean of each rank's gradient is the serial gradient).
"""

from dataclasses import dataclass
from typing import Optional

import torch

from .comm import gather_sequence


@dataclass
class JointInputs:
    """A joint call cut into its replicated text and its sharded video part."""

    text_q: torch.Tensor                 # [B, Mq, H, Dh] (Mq may be 0)
    text_k: torch.Tensor                 # [B, M, H, Dh]
    text_v: torch.Tensor
    video: torch.Tensor                  # [3, B, n, H, Dh]: q, k, v of this rank's shard
    text_mask: Optional[torch.Tensor]    # [B|1, 1|H, 1, M] key mask, or None


def split_joint(op_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
                local: int) -> JointInputs:
    """Cut ``[text; video shard]`` q/k/v (and the key mask) at the video shard of ``local`` tokens."""
    if min(q.size(1), k.size(1)) < local or k.size(1) != v.size(1):
        raise ValueError(f"{op_name} got q/k/v of {q.size(1)}/{k.size(1)}/{v.size(1)} tokens but the video shard "
                         f"alone has {local}: pass [text; video shard] along the sequence")
    text_q, text_kv = q.size(1) - local, k.size(1) - local
    text_mask = None
    if attn_mask is not None:
        if attn_mask.dim() != 4 or attn_mask.size(-2) != 1 or attn_mask.size(-1) != k.size(1) \
                or attn_mask.size(1) not in (1, q.size(2)):
            raise ValueError(f"{op_name} takes only a key mask [B|1, 1|H, 1, M + n] over [text; video shard] (text "
                             f"padding), got {tuple(attn_mask.shape)} for {k.size(1)} keys and {q.size(2)} heads")
        text_mask = attn_mask[..., :text_kv]
    video = torch.stack((q[:, text_q:], k[:, text_kv:], v[:, text_kv:]))                 # [3, B, n, H, Dh]
    return JointInputs(q[:, :text_q], k[:, :text_kv], v[:, :text_kv], video, text_mask)


def heads_of(x: Optional[torch.Tensor], rank: int, heads: int, dim: int = 2) -> Optional[torch.Tensor]:
    """This rank's ``heads`` heads (block ``rank``) along ``dim``; a head-broadcast mask (size 1) is kept."""
    if x is None or x.size(dim) == 1:
        return x
    return x.narrow(dim, rank * heads, heads)


def allow_all_like(mask: torch.Tensor, keys: int) -> torch.Tensor:
    """A key mask of ``mask``'s kind (bool or additive) and leading shape that lets ``keys`` keys through."""
    shape = mask.shape[:-1] + (keys,)
    if mask.dtype == torch.bool:
        return mask.new_ones(shape)
    return mask.new_zeros(shape)


def gather_text_heads(text_out: torch.Tensor, group) -> torch.Tensor:
    """``[B, Mq, H/U, Dh]`` text output of this rank's heads -> ``[B, Mq, H, Dh]`` on every rank of ``group``."""
    return gather_sequence(text_out.contiguous(), group, dim=2)
