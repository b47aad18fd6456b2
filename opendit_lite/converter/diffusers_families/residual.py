"""The second half of a diffusers adaLN-Zero block on one stream, shared by the double-stream
blocks of Flux, SD3 and HunyuanVideo: the attention output's gated residual fused with the next
norm and its modulation (``residual_norm_modulate``), the feed-forward, and its gated residual.

The unfused blocks compute, for the image stream and again for the text stream::

    x = x + gate_msa[:, None] * attn_output
    h = norm2(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    x = x + gate_mlp[:, None] * ff(h)

The first two lines read and write the residual stream five times; fused, once.
"""

from typing import Callable

import torch
import torch.nn as nn

from ..adaln_protocol import residual_norm_modulate


def residual_feed_forward(norm: nn.Module, feed_forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                          attn_output: torch.Tensor, gate_msa: torch.Tensor, shift_mlp: torch.Tensor,
                          scale_mlp: torch.Tensor, gate_mlp: torch.Tensor) -> torch.Tensor:
    """x, attn_output: [B, N, D]; gate_msa, shift_mlp, scale_mlp, gate_mlp: [B, D]. Returns [B, N, D]."""
    x, h = residual_norm_modulate(norm, x, attn_output, gate_msa, shift_mlp, scale_mlp)   # 2 x [B, N, D]
    return x + gate_mlp.unsqueeze(1) * feed_forward(h)                                    # [B, N, D]
