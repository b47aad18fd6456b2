"""Tiny models written outside the zoo, for the conversion and sequence-parallel tests:

* ``MetaDiT``: the DiT of facebookresearch/DiT ``models.py`` (its published architecture: timm
  ``PatchEmbed``/``Attention``/``Mlp``, adaLN-Zero blocks with affine-free LayerNorms, a module-level
  ``modulate``, a fixed positional embedding added before the first block), written here;
* ``tiny_diffusers_dit`` / ``tiny_pixart``: diffusers' ``DiTTransformer2DModel`` and
  ``PixArtTransformer2DModel`` at tiny sizes (16 tokens, 2 heads);
* ``UserDiT``: a user's own DiT that follows both protocols (``adaln_norms`` + ``norm_modulate`` in the
  block, ``attn_op`` + ``sequence_parallel_attention`` in the attention).

Every builder perturbs all weights (the models zero-initialise their modulation and output layers)
so that every parameter gets a non-trivial gradient.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from opendit_lite.converter import norm_modulate
from opendit_lite.models.layers.attention import SDPAAttentionOp

HIDDEN, HEADS, PATCH, IN_CHANNELS, NUM_CLASSES = 32, 4, 2, 4, 10


def perturb(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


# ---------------------------------------------------------------------------------- Meta's DiT

def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size, frequency_embedding_size=256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t, dim, max_period=10000):
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, t):
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes, hidden_size, dropout_prob):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)

    def forward(self, labels, train):
        return self.embedding_table(labels)


class DiTBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        from timm.models.vision_transformer import Attention, Mlp

        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(in_features=hidden_size, hidden_features=int(hidden_size * mlp_ratio),
                       act_layer=lambda: nn.GELU(approximate="tanh"), drop=0)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        x = modulate(self.norm_final(x), shift, scale)
        return self.linear(x)


class MetaDiT(nn.Module):
    def __init__(self, input_size=8, patch_size=PATCH, in_channels=IN_CHANNELS, hidden_size=HIDDEN, depth=2,
                 num_heads=HEADS, mlp_ratio=4.0, class_dropout_prob=0.0, num_classes=NUM_CLASSES, learn_sigma=True):
        super().__init__()
        from timm.models.vision_transformer import PatchEmbed

        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        num_patches = self.x_embedder.num_patches
        # Fixed positional embedding (sin-cos in Meta's code; any fixed values serve the tests).
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches, hidden_size), requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)

    def unpatchify(self, x):
        c, p = self.out_channels, self.patch_size
        h = w = int(x.shape[1] ** 0.5)
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, h * p)

    def forward(self, x, t, y):
        x = self.x_embedder(x) + self.pos_embed  # (N, T, D)
        c = self.t_embedder(t) + self.y_embedder(y, self.training)
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)
        return self.unpatchify(x)


def meta_dit(seed: int = 0) -> MetaDiT:
    torch.manual_seed(seed)
    return perturb(MetaDiT(), seed)


def meta_dit_inputs(batch: int = 2, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, IN_CHANNELS, 8, 8, generator=g), torch.randint(0, 1000, (batch,), generator=g),
            torch.randint(0, NUM_CLASSES, (batch,), generator=g))


# ---------------------------------------------------------------------------------- diffusers

def tiny_diffusers_dit(seed: int = 0, sample_size: int = 8):
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(seed)
    model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=IN_CHANNELS,
                                  num_layers=2, sample_size=sample_size, patch_size=PATCH,
                                  num_embeds_ada_norm=NUM_CLASSES)
    return perturb(model, seed)


def diffusers_dit_inputs(batch: int = 2, seed: int = 1) -> dict:
    x, t, y = meta_dit_inputs(batch, seed)
    return dict(hidden_states=x, timestep=t, class_labels=y, return_dict=False)


def tiny_pixart(seed: int = 0):
    from diffusers import PixArtTransformer2DModel

    torch.manual_seed(seed)
    model = PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=IN_CHANNELS, out_channels=2 * IN_CHANNELS,
        num_layers=2, sample_size=8, patch_size=PATCH, cross_attention_dim=16, caption_channels=12,
        norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6, use_additional_conditions=False,
    )
    return perturb(model, seed)


def pixart_inputs(batch: int = 2, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, 5)
    mask[0, 3:] = 0  # the first caption is shorter: a key mask in cross-attention
    return dict(hidden_states=torch.randn(batch, IN_CHANNELS, 8, 8, generator=g),
                encoder_hidden_states=torch.randn(batch, 5, 12, generator=g),
                encoder_attention_mask=mask, timestep=torch.randint(0, 1000, (batch,), generator=g),
                added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)


# ---------------------------------------------------------------------------------- a user's model

class UserAttention(nn.Module):
    """The attention protocol: the core through ``attn_op``, the role declared."""

    sequence_parallel_attention = "self"

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_op = SDPAAttentionOp()
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, D // self.heads).unbind(2)   # 3 x [B, N, H, Dh]
        return self.out(self.attn_op(q, k, v).reshape(B, N, D))                       # [B, N, D]


class UserBlock(nn.Module):
    """The AdaLN protocol: the modulated norms named, each used through ``norm_modulate``."""

    adaln_norms = ("norm1", "norm2")

    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = UserAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.ada = nn.Linear(dim, 6 * dim)

    def forward(self, x, c):
        s1, sc1, g1, s2, sc2, g2 = self.ada(F.silu(c)).chunk(6, dim=-1)               # 6 x [B, D]
        x = x + g1.unsqueeze(1) * self.attn(norm_modulate(self.norm1, x, s1, sc1))
        return x + g2.unsqueeze(1) * self.mlp(norm_modulate(self.norm2, x, s2, sc2))


class UserDiT(nn.Module):
    def __init__(self, dim=HIDDEN, heads=HEADS, depth=2, tokens=16, in_dim=8):
        super().__init__()
        self.embed = nn.Linear(in_dim, dim)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim))
        self.cond = nn.Linear(1, dim)
        self.blocks = nn.ModuleList([UserBlock(dim, heads) for _ in range(depth)])
        self.head = nn.Linear(dim, in_dim)

    def forward(self, x, t):
        # x: [B, N, in_dim]; t: [B]
        h = self.embed(x) + self.pos                                                  # [B, N, D]
        c = self.cond(t[:, None].float())                                             # [B, D]
        for block in self.blocks:
            h = block(h, c)
        return self.head(h)                                                           # [B, N, in_dim]


def user_dit(seed: int = 0) -> UserDiT:
    torch.manual_seed(seed)
    return perturb(UserDiT(), seed)


def user_dit_inputs(batch: int = 2, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 16, 8, generator=g), torch.rand(batch, generator=g)
