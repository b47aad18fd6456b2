"""Joint attention over text and video tokens with one projection set per stream (MMDiT, as in
SD3 and Vchitect-2.0): each stream keeps its own q/k/v and output projections, their tokens are
concatenated and attend to each other in one softmax, and the result is split back per stream.

The concatenation is ``[text; video]`` and the inner op sees it as one sequence. Under
sequence parallelism (Ulysses, ring, USP) the video part is sharded and the text part replicated;
the joint ops of ``opendit_lite.parallel`` (``joint.py``) tell the two apart from the lengths alone
(the text length is whatever the local video shard does not account for), so this module passes
nothing extra. Rotary angles apply to the video tokens only (text has no position on the grid).
A caption padding mask ``context_mask`` [B', M] (True = real token) keeps padded caption tokens
from acting as keys; the op receives it as a key mask ``[B', 1, 1, M + S]`` whose video part is
all True.
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn

from .attention import AttentionOp, SDPAAttentionOp
from .rope import apply_rope


class JointAttention(nn.Module):
    """x: video tokens [B', S, D]; context: text tokens [B', M, D] -> (x_out, context_out or None).

    ``context_pre_only`` (the last block): the text stream is only read, as keys and values; it has
    no queries, no output projection and no text output (as in SD3), so no parameter goes unused.
    """

    # For Pyramid Attention Broadcast (sampling's step cache): the patches of a frame, with the caption.
    attention_kind = "spatial"

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, context_pre_only: bool = False):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"JointAttention: dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.context_pre_only = context_pre_only
        self.to_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.to_k = nn.Linear(dim, dim, bias=qkv_bias)
        self.to_v = nn.Linear(dim, dim, bias=qkv_bias)
        self.add_q_proj = None if context_pre_only else nn.Linear(dim, dim, bias=qkv_bias)
        self.add_k_proj = nn.Linear(dim, dim, bias=qkv_bias)
        self.add_v_proj = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_op: AttentionOp = SDPAAttentionOp()
        self.to_out = nn.Linear(dim, dim)
        self.to_add_out = None if context_pre_only else nn.Linear(dim, dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim)              # [B', L, H, Dh]

    def forward(self, x: torch.Tensor, context: torch.Tensor, rope: Optional[torch.Tensor] = None,
                context_mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        B, S, C = x.shape
        M = context.shape[1]
        key_mask = None
        if context_mask is not None:                                                      # [B', M] bool
            video = context_mask.new_ones(B, S, dtype=torch.bool)
            key_mask = torch.cat([context_mask.bool(), video], dim=1)[:, None, None, :]   # [B', 1, 1, M + S]
        q, k, v = self._heads(self.to_q(x)), self._heads(self.to_k(x)), self._heads(self.to_v(x))  # [B', S, H, Dh]
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        ck = self._heads(self.add_k_proj(context))                                        # [B', M, H, Dh]
        cv = self._heads(self.add_v_proj(context))
        k, v = torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)                       # [B', M + S, H, Dh]
        if self.context_pre_only:
            out = self.attn_op(q, k, v, attn_mask=key_mask)                               # [B', S, H, Dh]
            return self.to_out(out.reshape(B, S, C)), None
        q = torch.cat([self._heads(self.add_q_proj(context)), q], dim=1)                  # [B', M + S, H, Dh]
        context_out, x_out = self.attn_op(q, k, v, attn_mask=key_mask).split([M, S], dim=1)  # [B', M | S, H, Dh]
        x_out = self.to_out(x_out.reshape(B, S, C))                                       # [B', S, C]
        return x_out, self.to_add_out(context_out.reshape(B, M, C))                       # [B', M, C]
