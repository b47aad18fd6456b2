"""Attention with a swappable inner op.

``Attention`` owns the projections (state-dict keys ``qkv.*`` and ``proj.*``, as in timm's
``Attention`` that Meta's DiT uses) and delegates the softmax(QK^T)V core to ``self.attn_op``,
a parameter-free submodule: an ``AttentionOp`` (``opendit_lite.kernels.attention_op``, re-exported
here), ``SDPAAttentionOp`` by default. The module converter swaps ``attn_op`` for another backend
(flash-attn) and the sequence-parallel conversion wraps it (Ulysses all-to-all), so model code is
the same for every backend and for serial and sequence-parallel runs.
"""

from typing import Optional

import torch
import torch.nn as nn

from ...kernels.attention_op import AttentionOp, SDPAAttentionOp

__all__ = ["Attention", "AttentionOp", "SDPAAttentionOp"]


class Attention(nn.Module):
    """Multi-head self-attention: ``qkv`` projection, ``attn_op``, ``proj`` projection."""

    # What it attends over, for Pyramid Attention Broadcast (sampling's step cache): the tokens of an image or frame.
    attention_kind = "spatial"

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"Attention: dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_op: AttentionOp = SDPAAttentionOp()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim)  # [B, N, 3, H, Dh]
        q, k, v = qkv.unbind(dim=2)                                     # 3 x [B, N, H, Dh]
        out = self.attn_op(q, k, v, attn_mask=attn_mask)                # [B, N, H, Dh]
        return self.proj(out.reshape(B, N, C))                          # [B, N, C]
