"""LayerNorm followed by adaLN modulation, as one module so a fused kernel can replace it.

``LayerNormModulate(x, shift, scale) = LayerNorm(x) * (1 + scale) + shift`` where the LayerNorm
has no affine parameters (so the module has no state-dict entries and checkpoints are unchanged)
and ``shift``/``scale`` are either per sample ``[B, D]`` (broadcast over the sequence, as in DiT)
or per token ``[B, N, D]`` (video models with per-frame modulation).

``GatedResidualNorm`` is adaLN-Zero's gated residual ``x + gate * h`` together with the LayerNorm +
modulate that follows it, for the same reason: one fused kernel can replace the pair.
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


class GatedResidualNorm(nn.Module):
    """adaLN-Zero's gated residual followed by the next LayerNorm + modulate, as one module so a
    fused kernel (one pass over the activations) can replace it.

    ``forward(x, h, gate, shift, scale)`` returns ``x_new = x + gate * h`` (the new residual
    stream) and ``LayerNorm(x_new) * (1 + scale) + shift`` (the next branch's input). x, h:
    [B, N, D]; gate, shift, scale: [B, D] per sample or [B, N, D] per token. No parameters, so
    swapping it for the fused module leaves the state dict unchanged.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps

    def forward(self, x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor,
                scale: torch.Tensor):
        if gate.dim() == x.dim() - 1:                              # [B, D] -> [B, 1, D]
            gate = gate.unsqueeze(1)
        x = x + gate * h                                           # [B, N, D]
        normed = F.layer_norm(x, (self.hidden_size,), eps=self.eps)  # [B, N, D]
        return x, modulate(normed, shift, scale)                   # 2 x [B, N, D]

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
