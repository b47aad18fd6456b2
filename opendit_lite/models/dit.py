"""DiT: class-conditional latent diffusion transformer (Peebles & Xie, "Scalable Diffusion Models
with Transformers", 2023), state-dict compatible with Meta's facebookresearch/DiT checkpoints.

The file reads top to bottom: the transformer block and final layer, the model, then the named
configurations. Differences from the reference implementation that do not change a single weight
or output value:

* ``norm1``/``norm_final`` are ``LayerNormModulate`` modules (affine-free LayerNorm and adaLN
  modulation in one call) and ``norm2`` a ``GatedResidualNorm`` (the attention branch's gated
  residual together with the MLP's norm), so fused kernels can replace them (``fused_adaln``);
* ``attn`` is our ``Attention`` whose inner op can be swapped (flash-attn, Ulysses) from outside;
* ``seq_split``/``seq_gather`` mark where sequence parallelism shards the tokens;
* latents may be non-square (``input_size=(H, W)``), and with ``variable_size=True`` of any size
  divisible by the patch (the sine-cosine table is computed for the input's patch grid; at the
  built size it is the stored ``pos_embed``), as bucketed training feeds them.

Activation checkpointing, FSDP/ZeRO wrapping and compilation are applied from outside, per block
(``get_fsdp_wrap_module_list``), so the model code carries no training-strategy switches.
"""

import functools
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import Mlp

from .cfg_layouts import concat_guided
from .layers.attention import Attention
from .layers.embeddings import (
    LabelEmbedder,
    PatchEmbed,
    TimestepEmbedder,
    get_2d_sincos_pos_embed,
)
from .layers.init import init_linears_xavier, init_patch_embed
from .layers.modulate import GatedResidualNorm, LayerNormModulate
from .layers.sequence import SequenceGather, SequenceSplit
from .registry import register_model

#################################################################################
#                                 Core DiT Model                                #
#################################################################################

class DiTBlock(nn.Module):
    """Transformer block with adaLN-Zero conditioning.

    The conditioning vector ``c`` is mapped to six [B, D] vectors: a shift and scale applied after
    each LayerNorm and a gate on each residual branch. The gates start at zero
    (``DiT.initialize_weights``), so at initialisation every block is the identity, which the
    DiT paper found to train best among its conditioning variants.
    """

    # Submodules that compute the conditioning (kept in bf16 under precision=fp8).
    conditioning_modules = ("adaLN_modulation",)
    # For sampling's step caches: the forward argument holding the tokens (see modulated_input too).
    cache_streams = ("x",)

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = LayerNormModulate(hidden_size, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, qkv_bias=True)
        # The attention residual x + gate_msa * attn(...) and the MLP's norm of it, in one module so
        # that one fused kernel can do both; parameter-free, like norm1.
        self.norm2 = GatedResidualNorm(hidden_size, eps=1e-6)
        self.mlp = Mlp(
            in_features=hidden_size,
            hidden_features=int(hidden_size * mlp_ratio),
            act_layer=functools.partial(nn.GELU, approximate="tanh"),  # DiT's tanh-approximated GELU
            drop=0.0,
        )
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        # x: [B, N, D] tokens; c: [B, D] conditioning (timestep + label embedding)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            self.adaLN_modulation(c).chunk(6, dim=1)                                    # 6 x [B, D]
        )
        h = self.attn(self.norm1(x, shift_msa, scale_msa))                             # [B, N, D]
        x, y = self.norm2(x, h, gate_msa, shift_mlp, scale_mlp)  # x + gate_msa * h, its modulated norm: 2 x [B, N, D]
        x = x + gate_mlp.unsqueeze(1) * self.mlp(y)                                     # [B, N, D]
        return x

    def modulated_input(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """What the attention of ``forward(x, c)`` reads: the timestep-modulated norm of x [B, N, D]
        (TeaCache's signal)."""
        shift_msa, scale_msa = self.adaLN_modulation(c).chunk(6, dim=1)[:2]            # 2 x [B, D]
        return self.norm1(x, shift_msa, scale_msa)                                      # [B, N, D]


class FinalLayer(nn.Module):
    """adaLN-modulated LayerNorm, then a linear map from each token to its ``p x p x C_out`` patch."""

    def __init__(self, hidden_size: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm_final = LayerNormModulate(hidden_size, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)  # 2 x [B, D]
        x = self.norm_final(x, shift, scale)                     # [B, N, D]
        return self.linear(x)                                    # [B, N, p*p*C_out]


class DiT(nn.Module):
    """Diffusion transformer over VAE latents, conditioned on a timestep and a class label.

    Args:
        input_size: latent height/width (int) or ``(H, W)``; 32 for 256px images with the
            8x-downsampling SD VAE. Fixed at construction because ``pos_embed`` is sized for it.
        patch_size: side of the square patches; the token count is ``(H / p) * (W / p)``.
        in_channels: latent channels (4 for the SD VAE).
        hidden_size, depth, num_heads, mlp_ratio: transformer width, number of blocks, attention
            heads, MLP expansion.
        class_dropout_prob: probability of replacing a label by the null class in training
            (classifier-free guidance); 0 builds a table without the null class.
        num_classes: number of class labels (1000 for ImageNet).
        learn_sigma: also predict the variance (output channels doubled), as improved DDPM does.
        timestep_spacing: frequency spacing of the timestep features, "meta" (the reference's) or
            "diffusers" (that of diffusers' ``DiTTransformer2DModel``, whose plain ``from_pretrained``
            then reproduces this model exactly; see ``interop/diffusers_dit.py``).
    """

    # Capabilities (see models/capabilities.py): class-conditional images, Ulysses, ring or USP
    # sequence parallelism, forward_with_cfg over [conditional; unconditional] (2B -> 2B).
    is_video = False
    supported_sp_modes = ("ulysses", "ring", "usp")
    guidance_layout = "concat"
    supports_gradient_checkpointing = True
    condition_dropout_kwarg = "force_drop_ids"  # the trainer's per-sample condition dropout
    # Inputs a mixed-precision wrapper must not cast: fractional diffusion times lose up to 4 steps in bf16.
    fp32_inputs = ("t",)
    timestep_spacings = tuple(TimestepEmbedder.SPACING_SHIFTS)  # model.timestep_spacing choices

    def __init__(
        self,
        input_size: Union[int, Tuple[int, int]] = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        class_dropout_prob: float = 0.1,
        num_classes: int = 1000,
        learn_sigma: bool = True,
        variable_size: bool = False,
        timestep_spacing: str = "meta",
    ):
        super().__init__()
        self.learn_sigma = learn_sigma
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.num_heads = num_heads

        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True,
                                     strict_img_size=not variable_size)
        self.t_embedder = TimestepEmbedder(hidden_size, spacing=timestep_spacing)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        self.input_size = self.x_embedder.img_size
        # A fixed table, but kept as a frozen Parameter (not a buffer) exactly as the reference
        # does, so that checkpoints contain ``pos_embed`` and parameter counts agree.
        self.pos_embed = nn.Parameter(torch.zeros(1, self.x_embedder.num_patches, hidden_size),
                                      requires_grad=False)
        self.seq_split = SequenceSplit(dim=1)
        self.blocks = nn.ModuleList(
            [DiTBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio) for _ in range(depth)]
        )
        self.seq_gather = SequenceGather(dim=1)
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """The reference initialisation, in one place."""
        # 1. Every Linear (attention, MLP, embedder MLPs, adaLN, output): xavier-uniform, zero bias.
        init_linears_xavier(self)

        # 2. Fixed 2D sine-cosine positional table for the (H/p, W/p) patch grid.
        with torch.no_grad():
            table = get_2d_sincos_pos_embed(self.pos_embed.shape[-1], self.x_embedder.grid_size,
                                            device=self.pos_embed.device)  # [N, D]
            self.pos_embed.copy_(table.unsqueeze(0))                        # [1, N, D]

        # 3. Patch embedding: xavier-init the conv kernel viewed as a [D, C*p*p] linear map, so
        #    its fan-in/fan-out are those of the per-patch projection it is.
        init_patch_embed(self.x_embedder.proj)

        # 4. Label table and timestep MLP: small normal(0, 0.02), as for transformer embeddings.
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)

        # 5. adaLN-Zero: zero each block's modulation output, so every gate is 0 and each block
        #    starts as the identity.
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)

        # 6. Final layer: zero modulation and output projection, so the initial prediction is 0.
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def get_fsdp_wrap_module_list(self) -> List[nn.Module]:
        """The repeated blocks: the units for sharding, activation checkpointing and offload."""
        return list(self.blocks)

    def unpatchify(self, x: torch.Tensor, grid=None) -> torch.Tensor:
        """[B, N, p*p*C] tokens -> [B, C, H, W] image, inverting the row-major patch order; ``grid``:
        the (h, w) patch grid, the built one by default."""
        c, p = self.out_channels, self.patch_size
        h, w = grid or self.x_embedder.grid_size
        if x.shape[1] != h * w:
            raise ValueError(f"unpatchify expects {h * w} tokens for a {h}x{w} patch grid, got {x.shape[1]}")
        x = x.reshape(x.shape[0], h, w, p, p, c)       # [B, h, w, p, p, C]
        x = torch.einsum("nhwpqc->nchpwq", x)          # [B, C, h, p, w, p]
        return x.reshape(x.shape[0], c, h * p, w * p)  # [B, C, H, W]

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                force_drop_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: [B, C, H, W] latents; t: [B] timesteps; y: [B] labels -> [B, C_out, H, W].
        force_drop_ids: [B] bool, labels to replace by the null class (instead of random dropout)."""
        grid = self.x_embedder.grid(x)           # (H/p, W/p)
        pos = self.pos_embed if grid == self.x_embedder.grid_size else get_2d_sincos_pos_embed(
            self.pos_embed.shape[-1], grid, device=x.device, dtype=self.pos_embed.dtype)[None]
        x = self.x_embedder(x) + pos             # [B, N, D], N = H * W / p**2
        x = self.seq_split(x)                    # [B, N_local, D]; N / sp_size under sequence parallel
        t = self.t_embedder(t)                   # [B, D]
        y = self.y_embedder(y, self.training, force_drop_ids)  # [B, D]
        c = t + y                                # [B, D]
        for block in self.blocks:
            x = block(x, c)                      # [B, N_local, D]
        x = self.seq_gather(x)                   # [B, N, D]
        x = self.final_layer(x, c)               # [B, N, p*p*C_out]
        return self.unpatchify(x, grid)          # [B, C_out, H, W]

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float,
                         guidance_channels: int = 3) -> torch.Tensor:
        """Classifier-free guided prediction for a batch laid out as [conditional; unconditional].

        x: [2B, C, H, W] whose second half is ignored (the first half is run twice); t: [2B];
        y: [2B] with real labels first and the null class (``num_classes``) second. Returns
        [2B, C_out, H, W] whose first ``guidance_channels`` channels are
        ``uncond + cfg_scale * (cond - uncond)`` in both halves and whose other channels (the
        learned variance) are the raw output. The default of 3 channels is the reference's,
        kept so published samples and FID numbers are reproduced exactly; pass
        ``guidance_channels=self.in_channels`` for the standard guidance on all noise channels.
        """
        return concat_guided(self, x, t, cfg_scale=cfg_scale, channels=guidance_channels, y=y)  # [2B, C_out, H, W]


#################################################################################
#                                   DiT Configs                                 #
#################################################################################

# Size name -> (depth, hidden_size, num_heads): the four model sizes of the DiT paper (Table 1).
DIT_SIZES: Dict[str, Tuple[int, int, int]] = {
    "XL": (28, 1152, 16),
    "L": (24, 1024, 16),
    "B": (12, 768, 12),
    "S": (12, 384, 6),
}
DIT_PATCH_SIZES = (2, 4, 8)


def _register_dit(name: str, depth: int, hidden_size: int, num_heads: int,
                  patch_size: int) -> Callable[..., DiT]:
    """Register and return the factory ``(**kwargs) -> DiT`` for one named configuration."""

    def factory(**kwargs) -> DiT:
        return DiT(depth=depth, hidden_size=hidden_size, num_heads=num_heads, patch_size=patch_size, **kwargs)

    factory.__name__ = factory.__qualname__ = name.replace("-", "_").replace("/", "_")
    factory.__doc__ = (f"{name}: {depth} blocks, hidden size {hidden_size}, {num_heads} heads, "
                       f"patch size {patch_size}; keyword arguments go to DiT.")
    return register_model(name, model_class=DiT)(factory)


# The reference's name -> factory table ("DiT-XL/2", ..., "DiT-S/8"), also usable as CLI choices.
DiT_models: Dict[str, Callable[..., DiT]] = {
    f"DiT-{size}/{patch}": _register_dit(f"DiT-{size}/{patch}", *DIT_SIZES[size], patch_size=patch)
    for size in DIT_SIZES
    for patch in DIT_PATCH_SIZES
}

# Small configurations, registered only (DiT_models stays the reference's): DiT-T/2 for tests and
# smoke runs, DiT-Mini/2 for the CPU demo (16x16 pixels -> 64 tokens; ~1.3M parameters) and
# DiT-Mini/4, the earlier demo model (32x32 pixels -> 64 tokens), whose runs still sample.
_register_dit("DiT-T/2", depth=2, hidden_size=64, num_heads=4, patch_size=2)
_register_dit("DiT-Mini/2", depth=4, hidden_size=128, num_heads=4, patch_size=2)
_register_dit("DiT-Mini/4", depth=4, hidden_size=128, num_heads=4, patch_size=4)
