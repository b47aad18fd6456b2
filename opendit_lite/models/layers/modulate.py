"""LayerNorm followed by adaLN modulation, as one module so a fused kernel can replace it.

``LayerNormModulate(x, shift, scale) = LayerNorm(x) * (1 + scale) + shift`` where the LayerNorm
has no affine parameters (so the module has no state-dict entries and checkpoints are unchanged)
and ``shift``/``scale`` are either per sample ``[B, D]`` (broadcast over the sequence, as in DiT)
or per token ``[B, N, D]`` (video models with per-frame modulation).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x * (1 + scale) + shift`` with [B, D] shift/scale broadcast over x's sequence axis."""
    if shift.dim() == x.dim() - 1:  # [B, D] -> [B, 1, D]
        shift, scale = shift.unsqueeze(1), scale.unsqueeze(1)
    return x * (1 + scale) + shift


class LayerNormModulate(nn.Module):
    """Affine-free LayerNorm then modulate. x: [B, N, D]; shift, scale: [B, D] or [B, N, D]."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps

    def forward(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(x, (self.hidden_size,), eps=self.eps)
        return modulate(normed, shift, scale)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
