"""Cross-attention from video/image tokens to caption tokens, with a swappable inner op.

Queries come from the tokens ``x`` (``q_linear``), keys and values from the caption context
(``kv_linear``, one matrix for both, as PixArt-alpha and Open-Sora name them so their checkpoints
map key for key). The softmax core is ``self.attn_op``, an ``AttentionOp`` like the one of
``Attention``: the backend conversion swaps it for flash-attn and sequence parallelism wraps it in
``SequenceParallelCrossAttentionOp`` (queries sharded, context replicated, no communication).
"""

from typing import Optional

import torch
import torch.nn as nn

from .attention import AttentionOp, SDPAAttentionOp


class CrossAttention(nn.Module):
    """Multi-head attention of ``x`` [B, N, D] to ``context`` [B, M, D]."""

    # What it attends over, for Pyramid Attention Broadcast (sampling's step cache): the caption.
    attention_kind = "cross"

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"CrossAttention: dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q_linear = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv_linear = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_op: AttentionOp = SDPAAttentionOp()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor,
                context_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """context_mask: optional bool [B, M], True for real caption tokens (False = padding)."""
        B, N, C = x.shape
        M = context.shape[1]
        q = self.q_linear(x).view(B, N, self.num_heads, self.head_dim)                 # [B, N, H, Dh]
        kv = self.kv_linear(context).view(B, M, 2, self.num_heads, self.head_dim)      # [B, M, 2, H, Dh]
        k, v = kv.unbind(dim=2)                                                        # 2 x [B, M, H, Dh]
        mask = None if context_mask is None else context_mask[:, None, None, :].bool()  # [B, 1, 1, M]
        out = self.attn_op(q, k, v, attn_mask=mask)                                    # [B, N, H, Dh]
        return self.proj(out.reshape(B, N, C))                                         # [B, N, C]
