"""Embedding layers shared by the text-to-video models: 3D patches of a latent clip, caption
tokens with a learned null caption for classifier-free guidance, and the inverse of the patching.
"""

import functools
from typing import Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import Mlp


class PatchEmbed3D(nn.Module):
    """Latent clip [B, C, T, H, W] -> tokens [B, T', S, D] with T' = T/pt and S = (H/ph) * (W/pw).

    A stride-equal-to-kernel Conv3d is one linear map per (pt, ph, pw) patch; ``proj`` is the key
    Open-Sora uses. The output keeps frames and patches as separate axes so that blocks can attend
    along either one.
    """

    def __init__(self, patch_size: Tuple[int, int, int] = (1, 2, 2), in_chans: int = 4, embed_dim: int = 1152):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.in_chans = in_chans
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)

    def grid(self, latent_shape) -> Tuple[int, int, int]:
        """(T', h, w) patch grid of a [.., T, H, W] latent; a size not divisible by the patch is an error."""
        T, H, W = latent_shape[-3:]
        if any(s % p for s, p in zip((T, H, W), self.patch_size)):
            raise ValueError(f"latent clip of size (T, H, W)={(T, H, W)} is not divisible by the patch size "
                             f"{self.patch_size}; pick num_frames and image size that are")
        return T // self.patch_size[0], H // self.patch_size[1], W // self.patch_size[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 5 or x.shape[1] != self.in_chans:
            raise ValueError(f"PatchEmbed3D expects latents [B, {self.in_chans}, T, H, W], got {list(x.shape)}")
        self.grid(x.shape)
        x = self.proj(x)                                   # [B, D, T', h, w]
        return x.flatten(3).permute(0, 2, 3, 1)            # [B, T', S, D]


def unpatchify_video(x: torch.Tensor, grid: Tuple[int, int, int], patch_size: Tuple[int, int, int],
                     out_channels: int) -> torch.Tensor:
    """Tokens [B, T', S, pt*ph*pw*C] -> clip [B, C, T'*pt, h*ph, w*pw] (inverse of PatchEmbed3D)."""
    t, h, w = grid
    pt, ph, pw = patch_size
    B = x.shape[0]
    x = x.reshape(B, t, h, w, pt, ph, pw, out_channels)     # [B, t, h, w, pt, ph, pw, C]
    x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)                   # [B, C, t, pt, h, ph, w, pw]
    return x.reshape(B, out_channels, t * pt, h * ph, w * pw)


class CaptionEmbedder(nn.Module):
    """Text-encoder states [B, M, caption_channels] -> [B, M, D] by a 2-layer GELU MLP (PixArt-alpha).

    ``y_embedding`` [M, caption_channels] is the learned null caption: during training each sample's
    caption is replaced by it with probability ``dropout_prob``, and at sampling time it is the
    unconditional input of classifier-free guidance (``null_caption``).
    """

    def __init__(self, caption_channels: int, hidden_size: int, max_tokens: int, dropout_prob: float = 0.1):
        super().__init__()
        self.y_proj = Mlp(in_features=caption_channels, hidden_features=hidden_size, out_features=hidden_size,
                          act_layer=functools.partial(nn.GELU, approximate="tanh"), drop=0.0)
        # Scaled so the null caption has about the per-channel magnitude of real encoder states.
        self.y_embedding = nn.Parameter(torch.randn(max_tokens, caption_channels) / caption_channels ** 0.5)
        self.max_tokens = max_tokens
        self.dropout_prob = dropout_prob

    def null_caption(self, batch_size: int) -> torch.Tensor:
        """[B, M, caption_channels]: the unconditional input for classifier-free guidance."""
        return self.y_embedding[None].expand(batch_size, -1, -1)

    def forward(self, y: torch.Tensor, train: bool, force_drop: Optional[torch.Tensor] = None) -> torch.Tensor:
        if y.dim() != 3 or y.shape[1:] != self.y_embedding.shape:
            raise ValueError(f"caption states must be [B, {self.max_tokens}, {self.y_embedding.shape[1]}] "
                             f"(pad/truncate the text encoder output to max_tokens), got {list(y.shape)}")
        drop = force_drop
        if drop is None and train and self.dropout_prob > 0:
            drop = torch.rand(y.shape[0], device=y.device) < self.dropout_prob
        if drop is not None:
            y = torch.where(drop[:, None, None].bool(), self.y_embedding.to(y.dtype)[None], y)
        return self.y_proj(y)                                # [B, M, D]
