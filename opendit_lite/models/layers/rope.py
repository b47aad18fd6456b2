"""Rotary position embeddings (RoFormer) for video tokens: 1D over frames, 2D over the patch grid.

A table holds one rotation angle per (position, frequency); ``apply_rope`` rotates consecutive
channel pairs ``(x[2i], x[2i+1])`` of each head by those angles, so the dot product of a query at
position ``m`` and a key at position ``n`` depends on ``m - n`` only. For the 2D table half of the
frequencies follow the row index and half the column index (the axial layout of Vchitect, SD3 and
Lumina). Tables are plain tensors computed from sizes, so a model runs at any resolution and
sequence parallelism can shard a table exactly like the tokens it belongs to.
"""

import torch


def _frequencies(dim: int, theta: float, device) -> torch.Tensor:
    if dim % 2 != 0:
        raise ValueError(f"rotary embedding needs an even number of channels, got {dim}")
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)  # [dim/2]


def rope_1d(head_dim: int, length: int, theta: float = 10000.0, device=None) -> torch.Tensor:
    """Angles [length, head_dim / 2] for positions 0 .. length-1 (float32)."""
    positions = torch.arange(length, dtype=torch.float64, device=device)                    # [L]
    return torch.outer(positions, _frequencies(head_dim, theta, device)).float()            # [L, Dh/2]


def rope_2d(head_dim: int, height: int, width: int, theta: float = 10000.0, device=None) -> torch.Tensor:
    """Angles [height * width, head_dim / 2] for a row-major patch grid: the first half of the
    channel pairs rotate with the row index, the second half with the column index."""
    if head_dim % 4 != 0:
        raise ValueError(f"2D rotary embedding needs head_dim divisible by 4, got {head_dim}")
    rows = rope_1d(head_dim // 2, height, theta, device)                                   # [h, Dh/4]
    cols = rope_1d(head_dim // 2, width, theta, device)                                    # [w, Dh/4]
    rows = rows[:, None, :].expand(height, width, -1)                                      # [h, w, Dh/4]
    cols = cols[None, :, :].expand(height, width, -1)                                      # [h, w, Dh/4]
    return torch.cat([rows, cols], dim=-1).reshape(height * width, head_dim // 2)          # [h*w, Dh/2]


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, N, H, Dh] by angles [N, Dh/2]; computed in float32, returned in x's dtype."""
    if angles.shape != (x.shape[1], x.shape[3] // 2):
        raise ValueError(f"rotary table of shape {tuple(angles.shape)} does not fit tokens of shape "
                         f"{tuple(x.shape)}; expected [{x.shape[1]}, {x.shape[3] // 2}]")
    pairs = x.float().unflatten(-1, (-1, 2))                                               # [B, N, H, Dh/2, 2]
    cos = angles.cos()[None, :, None, :]                                                   # [1, N, 1, Dh/2]
    sin = angles.sin()[None, :, None, :]
    even, odd = pairs.unbind(-1)                                                           # 2 x [B, N, H, Dh/2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)         # [B, N, H, Dh/2, 2]
    return rotated.flatten(-2).to(x.dtype)                                                 # [B, N, H, Dh]
