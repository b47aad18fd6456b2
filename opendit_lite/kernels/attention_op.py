"""The attention op: the one interface every attention backend implements, and torch's SDPA as the
default backend.

Models own their projections and call the softmax(QK^T)V core through a parameter-free ``attn_op``
submodule (``opendit_lite.models.layers.attention.Attention``). The module converter swaps it for
another backend (``FlashAttentionOp``) and sequence parallelism wraps it (Ulysses all-to-all), so
model code is the same for every backend and for serial and sequence-parallel runs.

Every attention op takes and returns the ``[B, N, H, Dh]`` layout (flash-attn's layout). This
module needs nothing but torch, so the models import it without loading Triton.
"""

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class AttentionOp(nn.Module):
    """Base class of the inner attention computation: ``(q, k, v) -> out``.

    q: [B, Nq, H, Dh]; k, v: [B, Nk, H, Dh]; attn_mask: optional boolean ``[B, 1|H, Nq, Nk]``
    (True = may attend) or additive float mask; returns [B, Nq, H, Dh].
    """

    backend = "base"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"backend={self.backend}"


class SDPAAttentionOp(AttentionOp):
    """torch.nn.functional.scaled_dot_product_attention (picks flash/mem-efficient/math itself)."""

    backend = "sdpa"

    def forward(self, q, k, v, attn_mask=None):
        # [B, N, H, Dh] -> [B, H, N, Dh] for SDPA, and back.
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask
        )
        return out.transpose(1, 2)
