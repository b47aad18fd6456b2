"""Input embedders shared by the diffusion transformers: image patches, diffusion timesteps, class
labels, and fixed sine-cosine positional tables.

Parameter names follow the layouts of Meta's DiT (``x_embedder.proj.*`` as in timm's
``PatchEmbed``, ``t_embedder.mlp.0/2.*``, ``y_embedder.embedding_table.*``) so that its public
checkpoints load without renaming. The positional tables are computed with torch (no numpy at run
time) and reproduce the reference tables value for value, including their axis order (see
``get_2d_sincos_pos_embed``).
"""

import math
import operator
from typing import Optional, Tuple, Union

import torch
import torch.nn as nn

Size2D = Union[int, Tuple[int, int]]


def _to_pair(size: Size2D, name: str) -> Tuple[int, int]:
    """``8 -> (8, 8)``; ``(8, 12) -> (8, 12)``; anything else is an error naming ``name``."""
    if isinstance(size, int):
        return size, size
    try:
        height, width = size
        return operator.index(height), operator.index(width)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an int or a pair of ints (height, width), got {size!r}") from None


#################################################################################
#                      Sine-cosine positional embedding tables                  #
#################################################################################

def sincos_embed_from_positions(embed_dim: int, positions: torch.Tensor) -> torch.Tensor:
    """Fixed sine-cosine features of arbitrary (possibly fractional) positions.

    positions: any shape, flattened to [M]; returns float64 [M, embed_dim] laid out as
    ``[sin(pos * omega), cos(pos * omega)]`` with ``omega_i = 10000 ** (-i / (embed_dim / 2))``.
    Computed in float64 because the reference tables are, so the float32 result matches them exactly.
    """
    if embed_dim % 2 != 0:
        raise ValueError(f"sine-cosine embedding needs an even embed_dim, got {embed_dim}")
    half = embed_dim // 2
    omega = torch.arange(half, dtype=torch.float64, device=positions.device) / half  # [D/2]
    omega = 1.0 / 10000.0 ** omega                                                      # [D/2]
    angles = positions.reshape(-1).to(torch.float64)[:, None] * omega[None, :]           # [M, D/2]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)                      # [M, D]


def get_1d_sincos_pos_embed(embed_dim: int, length: int, device: Optional[torch.device] = None,
                            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Table for positions ``0 .. length-1`` (e.g. video frames): [length, embed_dim]."""
    positions = torch.arange(length, dtype=torch.float32, device=device)                 # [L]
    return sincos_embed_from_positions(embed_dim, positions).to(dtype)                   # [L, D]


def get_2d_sincos_pos_embed(embed_dim: int, grid_size: Size2D, device: Optional[torch.device] = None,
                            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Table for an ``H x W`` patch grid (``grid_size`` int or (H, W)) in row-major token order.

    Returns [H * W, embed_dim]. The first half of each row encodes the token's column (w)
    coordinate and the second half its row (h) coordinate. That order is what the reference
    implementation produces (it builds ``meshgrid(grid_w, grid_h)`` and embeds ``grid[0]``, the
    column coordinate, first, although it names it ``emb_h``); keeping it is what makes pretrained
    checkpoints, whose ``pos_embed`` was trained against this layout, behave identically.
    """
    if embed_dim % 4 != 0:
        raise ValueError(f"2D sine-cosine embedding needs embed_dim divisible by 4, got {embed_dim}")
    grid_h, grid_w = _to_pair(grid_size, "grid_size")
    rows = torch.arange(grid_h, dtype=torch.float32, device=device)                      # [H]
    cols = torch.arange(grid_w, dtype=torch.float32, device=device)                      # [W]
    row_of_token, col_of_token = torch.meshgrid(rows, cols, indexing="ij")               # 2 x [H, W]
    emb_col = sincos_embed_from_positions(embed_dim // 2, col_of_token)                  # [H*W, D/2]
    emb_row = sincos_embed_from_positions(embed_dim // 2, row_of_token)                  # [H*W, D/2]
    return torch.cat([emb_col, emb_row], dim=1).to(dtype)                                # [H*W, D]


#################################################################################
#                    Embedding layers for images, timesteps, labels             #
#################################################################################

class PatchEmbed(nn.Module):
    """Split an image/latent into non-overlapping ``p x p`` patches and project each to ``embed_dim``.

    A stride-``p`` convolution is one linear map per patch; the layer is named ``proj`` as in
    timm's ``PatchEmbed`` so checkpoints written with timm's layer load unchanged. The input size is
    fixed at construction (the positional table depends on it), and a mismatching input is refused
    with an error rather than silently producing a different number of tokens, unless
    ``strict_img_size=False`` (timm's name): then any size divisible by the patch is taken.
    """

    def __init__(self, img_size: Size2D = 32, patch_size: int = 2, in_chans: int = 4,
                 embed_dim: int = 1152, bias: bool = True, strict_img_size: bool = True):
        super().__init__()
        self.strict_img_size = strict_img_size
        self.img_size = _to_pair(img_size, "img_size")
        self.patch_size = _to_pair(patch_size, "patch_size")
        if any(s % p != 0 for s, p in zip(self.img_size, self.patch_size)):
            raise ValueError(f"PatchEmbed: img_size {self.img_size} must be divisible by "
                             f"patch_size {self.patch_size}; pick a patch size dividing both sides")
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size,
                              bias=bias)

    def grid(self, x: torch.Tensor) -> Tuple[int, int]:
        """(h, w) patch grid of an input [B, C, H, W]."""
        return x.shape[-2] // self.patch_size[0], x.shape[-1] // self.patch_size[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.strict_img_size and x.dim() == 4 and x.shape[1] == self.in_chans:
            if any(s % p for s, p in zip(x.shape[-2:], self.patch_size)):
                raise ValueError(f"PatchEmbed: input size {tuple(x.shape[-2:])} is not divisible by the patch "
                                 f"size {self.patch_size}")
        elif x.dim() != 4 or x.shape[1] != self.in_chans or tuple(x.shape[-2:]) != self.img_size:
            raise ValueError(
                f"PatchEmbed expects input [B, {self.in_chans}, {self.img_size[0]}, {self.img_size[1]}], "
                f"got {list(x.shape)}; build the model with input_size matching the latent size "
                "(image size / VAE downsampling factor, e.g. 256px -> 32)"
            )
        x = self.proj(x)                     # [B, D, H/p, W/p]
        return x.flatten(2).transpose(1, 2)  # [B, N, D], N = (H/p) * (W/p), row-major


class TimestepEmbedder(nn.Module):
    """Diffusion timestep -> vector: fixed sinusoidal features, then a 2-layer SiLU MLP.

    The frequency features are computed in float32 (timesteps up to ~1000 times the highest
    frequency need that precision) and then cast to the MLP's dtype, so the module also runs when
    the model has been cast to bf16/fp16 for mixed-precision training.
    """

    # Frequency spacings: Meta's DiT divides the exponent by half the dimension; diffusers'
    # ``Timesteps(downscale_freq_shift=1)`` (its DiT, PixArt, SD3, ...) by half minus one.
    SPACING_SHIFTS = {"meta": 0, "diffusers": 1}

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256, spacing: str = "meta"):
        super().__init__()
        if spacing not in self.SPACING_SHIFTS:
            raise ValueError(f"timestep spacing {spacing!r} is not one of {', '.join(self.SPACING_SHIFTS)}")
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size, bias=True),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, bias=True),
        )
        self.frequency_embedding_size = frequency_embedding_size
        self.spacing = spacing

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0, shift: int = 0) -> torch.Tensor:
        """t: [B] (may be fractional) -> float32 [B, dim] laid out as ``[cos(t * f), sin(t * f)]``.

        Frequencies ``f_i = max_period ** (-i / (dim // 2 - shift))`` span periods from 2*pi up to
        about ``max_period`` (shift 0, Meta's spacing; 1 is diffusers'); the cos-before-sin order
        (opposite to the positional tables) is the one pretrained DiT checkpoints expect. An odd
        ``dim`` gets one zero column at the end.
        """
        half = dim // 2
        exponents = torch.arange(half, dtype=torch.float32, device=t.device) / (half - shift)  # [half]
        freqs = torch.exp(-math.log(max_period) * exponents)                             # [half]
        args = t.float()[:, None] * freqs[None, :]                                       # [B, half]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)                # [B, 2*half]
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)  # [B, dim]
        return embedding

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        shift = self.SPACING_SHIFTS[self.spacing]
        t_freq = self.timestep_embedding(t, self.frequency_embedding_size, shift=shift)  # [B, F] float32
        return self.mlp(t_freq.to(self.mlp[0].weight.dtype))                # [B, D]


class LabelEmbedder(nn.Module):
    """Class label -> vector, with label dropout for classifier-free guidance.

    When ``dropout_prob > 0`` the table has one extra row, index ``num_classes``, the "null" class.
    During training each label is replaced by it with probability ``dropout_prob`` so that the
    same network also learns the unconditional model; at sampling time the null class gives the
    unconditional half of a guided batch. With ``dropout_prob == 0`` there is no null row (the
    table then has exactly ``num_classes`` rows, as in the reference checkpoints).
    """

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float):
        super().__init__()
        if not 0.0 <= dropout_prob <= 1.0:
            raise ValueError(f"LabelEmbedder: dropout_prob must be in [0, 1], got {dropout_prob}")
        use_cfg_embedding = dropout_prob > 0
        self.embedding_table = nn.Embedding(num_classes + int(use_cfg_embedding), hidden_size)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels: torch.Tensor, force_drop_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Replace dropped labels by the null class: at random, or where ``force_drop_ids == 1``."""
        if force_drop_ids is None:
            drop_ids = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob  # [B]
        else:
            drop_ids = force_drop_ids == 1                                                  # [B]
        return torch.where(drop_ids, torch.full_like(labels, self.num_classes), labels)      # [B]

    def forward(self, labels: torch.Tensor, train: bool,
                force_drop_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            if self.dropout_prob == 0:
                raise ValueError("LabelEmbedder: force_drop_ids needs a null class, which exists only "
                                 "when the embedder was built with dropout_prob > 0")
            labels = self.token_drop(labels, force_drop_ids)  # [B]
        return self.embedding_table(labels)                   # [B, D]
