"""STDiT: the spatial-temporal diffusion transformer of Open-Sora 1.0 for text-to-video.

Each block, on tokens kept as [B, T, S, D] (frames x patches per frame):

1. spatial self-attention over the S patches of each frame;
2. temporal self-attention over the T frames at each patch position (no norm, sharing the
   spatial branch's gate, output projection zero-initialised so a pretrained image model is
   unchanged at the start, as in Open-Sora);
3. cross-attention of every token to the caption tokens;
4. an MLP.

Conditioning is PixArt-alpha's "t2i" modulation: the timestep embedding is mapped once, at model
level, to six [B, D] vectors (``t_block``); each block adds its own learned ``scale_shift_table``
[6, D] and uses the sums as shift/scale/gate. That costs 6*D parameters per block instead of the
6*D*D of DiT's per-block adaLN. Captions are T5 states (4096 channels) projected by an MLP; a learned
null caption serves classifier-free guidance.

Differences from Open-Sora 1.0 that keep the design: positional tables (2D sine-cosine over the
patch grid plus 1D over frames) are added once after the patch embedding instead of adding the
temporal table inside the first block, and are computed from the input size, so one model runs at
any clip size.

Sequence parallelism is applied from outside (``opendit_lite.parallel``): ``seq_split`` /
``seq_gather`` shard and gather the patches of each frame (axis 2); under Ulysses spatial
attention exchanges heads, temporal attention is local and cross-attention needs no communication.
Under DSP the ``to_frames``/``to_patches`` switches re-shard by frames for spatial attention and
back by patches for the rest of the block, one all-to-all each.
"""

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import Mlp

from .cfg_layouts import paired_guided
from .layers.axis_attention import SpatialAttention, TemporalAttention
from .layers.cross_attention import CrossAttention
from .layers.embeddings import (
    TimestepEmbedder,
    get_1d_sincos_pos_embed,
    get_2d_sincos_pos_embed,
)
from .layers.init import init_linears_xavier, init_patch_embed
from .layers.modulate import LayerNormModulate
from .layers.sequence import SequenceGather, SequenceSplit
from .layers.sequence_switch import SequenceSwitch
from .layers.video_embed import CaptionEmbedder, PatchEmbed3D, unpatchify_video
from .registry import register_variant


def _tanh_gelu() -> nn.Module:
    return nn.GELU(approximate="tanh")


class STDiTBlock(nn.Module):
    """Spatial attention, temporal attention, cross-attention, MLP with t2i modulation."""

    # For sampling's step caches: the forward argument holding the tokens (see modulated_input too).
    cache_streams = ("x",)

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = LayerNormModulate(hidden_size, eps=1e-6)
        self.attn = SpatialAttention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.attn_temp = TemporalAttention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.cross_attn = CrossAttention(hidden_size, num_heads=num_heads)
        self.norm2 = LayerNormModulate(hidden_size, eps=1e-6)
        self.mlp = Mlp(in_features=hidden_size, hidden_features=int(hidden_size * mlp_ratio),
                       act_layer=_tanh_gelu, drop=0.0)
        # Added to the model-level t-projection: per block shift/scale/gate for attention and MLP.
        self.scale_shift_table = nn.Parameter(torch.randn(6, hidden_size) / hidden_size ** 0.5)
        self.to_frames = SequenceSwitch(scatter_dim=1, gather_dim=2)
        self.to_patches = SequenceSwitch(scatter_dim=2, gather_dim=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor, t0: torch.Tensor,
                y_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        # x: [B, T, S, D] (local shard); y: [B, M, D] captions; t0: [B, 6D]; y_mask: [B, M] bool
        B, D = x.shape[0], x.shape[-1]
        mods = (self.scale_shift_table[None] + t0.view(B, 6, D)).unsqueeze(2)       # [B, 6, 1, D]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods.unbind(1)  # 6 x [B, 1, D]

        # Spatial attention, each rank holding whole frames.
        x = self.to_frames(x)                                                       # [B, T, S, D]
        _, T, S, _ = x.shape
        h = self.norm1(x.reshape(B, T * S, D), shift_msa, scale_msa)                # [B, T*S, D]
        h = self.attn(h.reshape(B * T, S, D)).reshape(B, T * S, D)                  # [B, T*S, D]
        x = x + (gate_msa * h).view(B, T, S, D)                                     # [B, T, S, D]

        # Everything else, each rank holding whole frame sequences at some patch positions.
        x = self.to_patches(x)                                                      # [B, T, S, D]
        _, T, S, _ = x.shape
        h = x.transpose(1, 2).reshape(B * S, T, D)                                  # [B*S, T, D]
        h = self.attn_temp(h).view(B, S, T, D).transpose(1, 2)                      # [B, T, S, D]
        x = x + gate_msa.unsqueeze(1) * h                                           # [B, T, S, D]
        x = x.reshape(B, T * S, D)                                                  # [B, N, D]
        x = x + self.cross_attn(x, y, y_mask)                                       # [B, N, D]
        x = x + gate_mlp * self.mlp(self.norm2(x, shift_mlp, scale_mlp))            # [B, N, D]
        return x.view(B, T, S, D)

    def modulated_input(self, x: torch.Tensor, y: torch.Tensor, t0: torch.Tensor,
                        y_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The timestep-modulated norm of this rank's tokens x [B, T, S, D] that spatial attention
        reads (TeaCache's signal), as [B, T*S, D]."""
        B, D = x.shape[0], x.shape[-1]
        shift_msa, scale_msa = (self.scale_shift_table[None, :2] + t0.view(B, 6, D)[:, :2]).unsqueeze(2).unbind(1)
        return self.norm1(x.reshape(B, -1, D), shift_msa, scale_msa)               # [B, T*S, D]


class T2IFinalLayer(nn.Module):
    """Norm, t2i modulation (shift/scale from a [2, D] table plus the timestep embedding), linear."""

    def __init__(self, hidden_size: int, num_patch: int, out_channels: int):
        super().__init__()
        self.norm_final = LayerNormModulate(hidden_size, eps=1e-6)
        self.linear = nn.Linear(hidden_size, num_patch * out_channels)
        self.scale_shift_table = nn.Parameter(torch.randn(2, hidden_size) / hidden_size ** 0.5)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # x: [B, N, D]; t: [B, D] timestep embedding
        shift, scale = (self.scale_shift_table[None] + t[:, None]).unbind(1)     # 2 x [B, D]
        return self.linear(self.norm_final(x, shift, scale))                      # [B, N, p*C]


class STDiT(nn.Module):
    """Text-to-video STDiT over latent clips [B, C, T, H, W]; see the module docstring.

    Args:
        in_channels: latent channels (4 for the SD VAE).
        patch_size: (pt, ph, pw); Open-Sora uses (1, 2, 2).
        caption_channels: width of the text encoder states (4096 for T5-XXL).
        model_max_length: caption tokens per sample (120 in Open-Sora).
        class_dropout_prob: probability of training on the null caption (for CFG).
        learn_sigma: also predict the variance (output channels doubled) for IDDPM.
    """

    # Capabilities (see models/capabilities.py): captioned clips, Ulysses, ring, USP or DSP (its
    # to_frames / to_patches switches), forward_with_cfg over B clips adding the null caption inside (B -> B).
    is_video = True
    supported_sp_modes = ("ulysses", "ring", "usp", "dsp")
    guidance_layout = "paired"
    supports_gradient_checkpointing = True
    condition_dropout_kwarg = "force_drop"  # the trainer's per-sample condition dropout
    # Inputs a mixed-precision wrapper must not cast: fractional diffusion times lose up to 4 steps in bf16.
    fp32_inputs = ("t",)

    def __init__(self, in_channels: int = 4, patch_size: Tuple[int, int, int] = (1, 2, 2),
                 hidden_size: int = 1152, depth: int = 28, num_heads: int = 16, mlp_ratio: float = 4.0,
                 caption_channels: int = 4096, model_max_length: int = 120, class_dropout_prob: float = 0.1,
                 learn_sigma: bool = True):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.learn_sigma = learn_sigma
        self.patch_size = tuple(patch_size)
        self.hidden_size = hidden_size
        self.num_heads = num_heads

        self.x_embedder = PatchEmbed3D(self.patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))
        self.y_embedder = CaptionEmbedder(caption_channels, hidden_size, model_max_length, class_dropout_prob)
        self.seq_split = SequenceSplit(dim=2)
        self.blocks = nn.ModuleList([STDiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth)])
        self.seq_gather = SequenceGather(dim=2)
        num_patch = self.patch_size[0] * self.patch_size[1] * self.patch_size[2]
        self.final_layer = T2IFinalLayer(hidden_size, num_patch, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """Open-Sora's initialisation, in one place."""
        # 1. Every Linear: xavier-uniform, zero bias.
        init_linears_xavier(self)
        # 2. Patch embedding as the per-patch linear map it is.
        init_patch_embed(self.x_embedder.proj)
        # 3. Timestep MLP, t-projection and caption MLP: normal(0, 0.02) as transformer embeddings.
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        nn.init.normal_(self.t_block[1].weight, std=0.02)
        nn.init.normal_(self.y_embedder.y_proj.fc1.weight, std=0.02)
        nn.init.normal_(self.y_embedder.y_proj.fc2.weight, std=0.02)
        for block in self.blocks:
            # 4. Cross-attention output zeroed: every block starts ignoring the caption.
            nn.init.zeros_(block.cross_attn.proj.weight)
            nn.init.zeros_(block.cross_attn.proj.bias)
            # 5. Temporal attention output zeroed: every block starts as a per-frame image block.
            nn.init.zeros_(block.attn_temp.proj.weight)
            nn.init.zeros_(block.attn_temp.proj.bias)
        # 6. Output projection zeroed: the initial prediction is 0.
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def get_fsdp_wrap_module_list(self) -> List[nn.Module]:
        """The repeated blocks: the units for sharding, activation checkpointing and offload."""
        return list(self.blocks)

    def null_caption(self, batch_size: int) -> torch.Tensor:
        """Caption states [B, M, caption_channels] meaning "no caption" (CFG's unconditional input)."""
        return self.y_embedder.null_caption(batch_size)

    def positional_embedding(self, grid: Tuple[int, int, int], device, dtype) -> torch.Tensor:
        """Fixed table [T', S, D]: 2D sine-cosine over the patch grid plus 1D over frames."""
        t, h, w = grid
        spatial = get_2d_sincos_pos_embed(self.hidden_size, (h, w), device=device, dtype=dtype)  # [S, D]
        temporal = get_1d_sincos_pos_embed(self.hidden_size, t, device=device, dtype=dtype)      # [T', D]
        return spatial[None] + temporal[:, None]                                                 # [T', S, D]

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                mask: Optional[torch.Tensor] = None, force_drop: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: [B, C, T, H, W] latents; t: [B] timesteps; y: [B, M, caption_channels] caption states;
        mask: optional bool [B, M] (True = real caption token) -> [B, C_out, T, H, W]."""
        grid = self.x_embedder.grid(x.shape)
        x = self.x_embedder(x)                                          # [B, T', S, D]
        x = x + self.positional_embedding(grid, x.device, x.dtype)      # [B, T', S, D]
        x = self.seq_split(x)                                           # [B, T', S_local, D]
        t = self.t_embedder(t)                                          # [B, D]
        t0 = self.t_block(t)                                            # [B, 6D]
        y = self.y_embedder(y, self.training, force_drop)               # [B, M, D]
        for block in self.blocks:
            x = block(x, y, t0, mask)                                   # [B, T', S_local, D]
        x = self.seq_gather(x)                                          # [B, T', S, D]
        B, T, S, D = x.shape
        x = self.final_layer(x.reshape(B, T * S, D), t)                 # [B, N, p*C_out]
        return unpatchify_video(x.view(B, T, S, -1), grid, self.patch_size, self.out_channels)

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float,
                         mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Guided prediction for x, t [B]: runs [captions; null caption] as one batch of 2B and
        returns ``uncond + cfg_scale * (cond - uncond)`` on the noise channels (the learned variance,
        if any, is the conditional one). Returns [B, C_out, T, H, W]."""
        return paired_guided(self, x, t, y, mask, cfg_scale=cfg_scale)  # [B, C_out, T, H, W]


#################################################################################
#                                  STDiT Configs                                #
#################################################################################

def _register_stdit(name: str, **config) -> Callable[..., STDiT]:
    return register_variant(name, STDiT, **config)


# Open-Sora 1.0's STDiT-XL/2 (~0.7B parameters with the caption MLP).
STDiT_XL_2 = _register_stdit("STDiT-XL/2", depth=28, hidden_size=1152, num_heads=16, patch_size=(1, 2, 2))
# For tests and CPU demos: 2 blocks, width 64, 4 heads (head_dim 16), 32-channel captions of 8 tokens.
STDiT_tiny = _register_stdit("STDiT-tiny", depth=2, hidden_size=64, num_heads=4, patch_size=(1, 2, 2),
                             caption_channels=32, model_max_length=8)
