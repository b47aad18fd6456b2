"""Self-attention along one axis of a video: over the patches of each frame (spatial) or over the
frames at each patch position (temporal).

Both are ``Attention`` (same ``qkv``/``proj`` keys, same swappable ``attn_op``, so the backend
conversion applies) with an optional rotary table. They are separate types because sequence
parallelism must know which axis an op attends along: the video models shard the patches of
each frame, so spatial attention needs the Ulysses all-to-all while temporal attention attends
over frames that every rank holds in full and stays a local op (``opendit_lite.parallel.dsp``
registers both).
"""

from typing import Optional

import torch

from .attention import Attention
from .rope import apply_rope


class AxisAttention(Attention):
    """``Attention`` over x [B', L, D] with optional rotary angles [L, Dh/2] applied to q and k."""

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                rope: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, L, C = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, self.head_dim).unbind(dim=2)  # 3 x [B, L, H, Dh]
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = self.attn_op(q, k, v, attn_mask=attn_mask)                                   # [B, L, H, Dh]
        return self.proj(out.reshape(B, L, C))                                             # [B, L, C]


class SpatialAttention(AxisAttention):
    """Attention among the patches of one frame: x is [B * T, S, D]."""


class TemporalAttention(AxisAttention):
    """Attention among the frames at one patch position: x is [B * S, T, D]."""

    attention_kind = "temporal"
