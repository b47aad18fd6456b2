"""A Vchitect-2.0-style text-to-video transformer (the "VchitectXL" design).

Each block, on video tokens kept as [B, T, S, D] and text tokens [B, M, D]:

1. joint spatial attention: for every frame, the frame's S patches and the M caption tokens are
   concatenated and attend to each other in one softmax, each stream with its own q/k/v and output
   projections (MMDiT); 2D rotary embeddings on the video queries/keys give patch positions.
   The text stream's update is the mean over frames of its per-frame outputs;
2. temporal attention over the T frames at each patch position, with 1D rotary embeddings;
3. an MLP per stream.

All modulation is adaLN-Zero from the timestep embedding: nine vectors for the video stream (shift,
scale, gate for the three sub-layers) and six for the text stream; the last block only reads the
text (``context_pre_only``), so it needs two and has no text output projection or text MLP,
exactly as SD3/Vchitect do, which also leaves no parameter without a gradient.

Sequence parallelism (``opendit_lite.parallel``): ``seq_split``/``seq_gather`` shard the patches
of each frame (axis 2) and ``rope_split`` shards the spatial rotary table the same way. Joint
attention then runs as Ulysses, ring or USP with the replicated text sliced by head on each rank
(the joint ops of ``opendit_lite.parallel``), temporal attention is local.

Sizes: ``Vchitect-XL`` is depth 20, width 1536, 24 heads of 64 channels: 2.02B parameters, the
2B class of Vchitect-2.0. A block here carries a full text stream (q/k/v/out, MLP, adaLN), about
43*D^2 parameters, so the released model's depth 30 / width 3072 would be ~12B with this block; we
keep its head size and head count (24 heads, divisible by Ulysses sizes 2, 4, 8) and trade depth
for the parameter budget. ``Vchitect-tiny`` is for tests.
"""

import functools
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import Mlp

from .cfg_layouts import paired_guided
from .layers.axis_attention import TemporalAttention
from .layers.embeddings import TimestepEmbedder
from .layers.init import init_linears_xavier, init_patch_embed
from .layers.joint_attention import JointAttention
from .layers.modulate import LayerNormModulate
from .layers.rope import rope_1d, rope_2d
from .layers.sequence import SequenceGather, SequenceSplit
from .layers.video_embed import CaptionEmbedder, PatchEmbed3D, unpatchify_video
from .registry import register_variant


def _mlp(hidden_size: int, mlp_ratio: float) -> Mlp:
    return Mlp(in_features=hidden_size, hidden_features=int(hidden_size * mlp_ratio),
               act_layer=functools.partial(nn.GELU, approximate="tanh"), drop=0.0)


class VchitectBlock(nn.Module):
    """Joint spatial attention, temporal attention and MLPs, adaLN-Zero modulated."""

    # For sampling's step caches: the forward arguments holding the video tokens and the text stream
    # (the block returns both, in that order; see modulated_input too).
    cache_streams = ("x", "context")

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0, context_pre_only: bool = False):
        super().__init__()
        self.context_pre_only = context_pre_only
        self.norm1 = LayerNormModulate(hidden_size, eps=1e-6)
        self.norm1_context = LayerNormModulate(hidden_size, eps=1e-6)
        self.attn = JointAttention(hidden_size, num_heads, context_pre_only=context_pre_only)
        self.norm_temp = LayerNormModulate(hidden_size, eps=1e-6)
        self.attn_temp = TemporalAttention(hidden_size, num_heads=num_heads)
        self.norm2 = LayerNormModulate(hidden_size, eps=1e-6)
        self.mlp = _mlp(hidden_size, mlp_ratio)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 9 * hidden_size))
        context_mods = 2 if context_pre_only else 6
        self.adaLN_context = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, context_mods * hidden_size))
        if not context_pre_only:
            self.norm2_context = LayerNormModulate(hidden_size, eps=1e-6)
            self.mlp_context = _mlp(hidden_size, mlp_ratio)

    def forward(self, x: torch.Tensor, context: torch.Tensor, c: torch.Tensor, rope_spatial: torch.Tensor,
                rope_temporal: torch.Tensor, context_mask: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        # x: [B, T, S, D] (local shard); context: [B, M, D]; c: [B, D] timestep embedding;
        # rope_spatial: [S, Dh/2] (local shard); rope_temporal: [T, Dh/2]; context_mask: [B, M] bool
        B, T, S, D = x.shape
        M = context.shape[1]
        (shift_msa, scale_msa, gate_msa, shift_tmp, scale_tmp, gate_tmp,
         shift_mlp, scale_mlp, gate_mlp) = self.adaLN_modulation(c).unsqueeze(1).chunk(9, dim=-1)  # 9 x [B, 1, D]
        context_mods = self.adaLN_context(c).unsqueeze(1).chunk(2 if self.context_pre_only else 6, dim=-1)

        # 1. Joint spatial attention, per frame, with the caption repeated for every frame.
        x = x.reshape(B, T * S, D)                                                        # [B, N, D]
        h = self.norm1(x, shift_msa, scale_msa).view(B * T, S, D)                         # [B*T, S, D]
        hc = self.norm1_context(context, context_mods[0], context_mods[1])                # [B, M, D]
        hc = hc[:, None].expand(B, T, M, D).reshape(B * T, M, D)                          # [B*T, M, D]
        frame_mask = None if context_mask is None else context_mask.repeat_interleave(T, dim=0)  # [B*T, M]
        h, hc = self.attn(h, hc, rope_spatial, frame_mask)                                # [B*T, S, D], [B*T, M, D]
        x = x + gate_msa * h.view(B, T * S, D)                                            # [B, N, D]

        # 2. Temporal attention at each patch position.
        h = self.norm_temp(x, shift_tmp, scale_tmp).view(B, T, S, D)                     # [B, T, S, D]
        h = self.attn_temp(h.transpose(1, 2).reshape(B * S, T, D), rope=rope_temporal)    # [B*S, T, D]
        x = x + gate_tmp * h.view(B, S, T, D).transpose(1, 2).reshape(B, T * S, D)        # [B, N, D]

        # 3. MLPs.
        x = x + gate_mlp * self.mlp(self.norm2(x, shift_mlp, scale_mlp))                 # [B, N, D]
        x = x.view(B, T, S, D)
        if self.context_pre_only:
            return x, context  # the text stream was only read
        _, _, gate_c, shift_c_mlp, scale_c_mlp, gate_c_mlp = context_mods
        context = context + gate_c * hc.view(B, T, M, D).mean(dim=1)                      # [B, M, D]
        context = context + gate_c_mlp * self.mlp_context(self.norm2_context(context, shift_c_mlp, scale_c_mlp))
        return x, context

    def modulated_input(self, x: torch.Tensor, context: torch.Tensor, c: torch.Tensor, *args, **kwargs
                        ) -> torch.Tensor:
        """The timestep-modulated norm of this rank's video tokens x [B, T, S, D] that joint attention
        reads (TeaCache's signal), as [B, T*S, D]."""
        B, D = x.shape[0], x.shape[-1]
        shift_msa, scale_msa = self.adaLN_modulation(c).unsqueeze(1).chunk(9, dim=-1)[:2]  # 2 x [B, 1, D]
        return self.norm1(x.reshape(B, -1, D), shift_msa, scale_msa)                      # [B, T*S, D]


class VchitectFinalLayer(nn.Module):
    """adaLN-modulated norm and linear to the patch values (DiT's final layer)."""

    def __init__(self, hidden_size: int, num_patch: int, out_channels: int):
        super().__init__()
        self.norm_final = LayerNormModulate(hidden_size, eps=1e-6)
        self.linear = nn.Linear(hidden_size, num_patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)                          # 2 x [B, D]
        return self.linear(self.norm_final(x, shift, scale))                              # [B, N, p*C]


class VchitectXL(nn.Module):
    """Text-to-video model over latent clips [B, C, T, H, W]; see the module docstring.

    Args mirror ``STDiT``: caption states [B, model_max_length, caption_channels] are projected by
    an MLP with a learned null caption for classifier-free guidance.
    """

    # Capabilities (see models/capabilities.py): captioned clips, Ulysses, ring or USP (no DSP switches),
    # forward_with_cfg over B clips adding the null caption inside (B -> B).
    is_video = True
    supported_sp_modes = ("ulysses", "ring", "usp")
    guidance_layout = "paired"
    supports_gradient_checkpointing = True
    condition_dropout_kwarg = "force_drop"  # the trainer's per-sample condition dropout
    # Inputs a mixed-precision wrapper must not cast: fractional diffusion times lose up to 4 steps in bf16.
    fp32_inputs = ("t",)

    def __init__(self, in_channels: int = 4, patch_size: Tuple[int, int, int] = (1, 2, 2),
                 hidden_size: int = 1536, depth: int = 20, num_heads: int = 24, mlp_ratio: float = 4.0,
                 caption_channels: int = 4096, model_max_length: int = 120, class_dropout_prob: float = 0.1,
                 learn_sigma: bool = False, rope_theta: float = 10000.0):
        super().__init__()
        if depth < 1:
            raise ValueError(f"VchitectXL needs depth >= 1, got {depth}")
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.learn_sigma = learn_sigma
        self.patch_size = tuple(patch_size)
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.rope_theta = rope_theta

        self.x_embedder = PatchEmbed3D(self.patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = CaptionEmbedder(caption_channels, hidden_size, model_max_length, class_dropout_prob)
        self.seq_split = SequenceSplit(dim=2)
        self.rope_split = SequenceSplit(dim=0)
        self.blocks = nn.ModuleList([
            VchitectBlock(hidden_size, num_heads, mlp_ratio, context_pre_only=(i == depth - 1))
            for i in range(depth)
        ])
        self.seq_gather = SequenceGather(dim=2)
        num_patch = self.patch_size[0] * self.patch_size[1] * self.patch_size[2]
        self.final_layer = VchitectFinalLayer(hidden_size, num_patch, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        # 1. Every Linear: xavier-uniform, zero bias.
        init_linears_xavier(self)
        # 2. Patch embedding as the per-patch linear map it is.
        init_patch_embed(self.x_embedder.proj)
        # 3. Embedding MLPs: normal(0, 0.02).
        for linear in (self.t_embedder.mlp[0], self.t_embedder.mlp[2],
                       self.y_embedder.y_proj.fc1, self.y_embedder.y_proj.fc2):
            nn.init.normal_(linear.weight, std=0.02)
        # 4. adaLN-Zero: all gates (and shifts/scales) start at zero, every block is the identity.
        for block in self.blocks:
            for modulation in (block.adaLN_modulation, block.adaLN_context):
                nn.init.zeros_(modulation[-1].weight)
                nn.init.zeros_(modulation[-1].bias)
        # 5. Final layer zeroed: the initial prediction is 0.
        for linear in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)

    def get_fsdp_wrap_module_list(self) -> List[nn.Module]:
        """The repeated blocks: the units for FSDP wrapping (LiteGen's hook), checkpointing and offload."""
        return list(self.blocks)

    def null_caption(self, batch_size: int) -> torch.Tensor:
        return self.y_embedder.null_caption(batch_size)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                mask: Optional[torch.Tensor] = None, force_drop: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: [B, C, T, H, W]; t: [B]; y: [B, M, caption_channels] -> [B, C_out, T, H, W].

        ``mask``: optional bool [B, M], True for real caption tokens; padded tokens are not attended
        to (they still carry a text stream of their own, which nothing reads), so a caption gives
        the same video output whatever padding it is batched with.
        """
        grid = self.x_embedder.grid(x.shape)
        x = self.x_embedder(x)                                                   # [B, T', S, D]
        x = self.seq_split(x)                                                    # [B, T', S_local, D]
        rope_spatial = rope_2d(self.head_dim, grid[1], grid[2], self.rope_theta, x.device)  # [S, Dh/2]
        rope_spatial = self.rope_split(rope_spatial)                             # [S_local, Dh/2]
        rope_temporal = rope_1d(self.head_dim, grid[0], self.rope_theta, x.device)  # [T', Dh/2]
        c = self.t_embedder(t)                                                   # [B, D]
        context = self.y_embedder(y, self.training, force_drop)                  # [B, M, D]
        for block in self.blocks:
            x, context = block(x, context, c, rope_spatial, rope_temporal, mask)  # [B, T', S_local, D]
        x = self.seq_gather(x)                                                   # [B, T', S, D]
        B, T, S, D = x.shape
        x = self.final_layer(x.reshape(B, T * S, D), c)                          # [B, N, p*C_out]
        return unpatchify_video(x.view(B, T, S, -1), grid, self.patch_size, self.out_channels)

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float,
                         mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Guided prediction with the null caption; see ``STDiT.forward_with_cfg``."""
        return paired_guided(self, x, t, y, mask, cfg_scale=cfg_scale)  # [B, C_out, T, H, W]


def _register_vchitect(name: str, **config) -> Callable[..., VchitectXL]:
    return register_variant(name, VchitectXL, **config)


Vchitect_XL = _register_vchitect("Vchitect-XL", depth=20, hidden_size=1536, num_heads=24)
# For tests and CPU demos: 2 blocks (one full, one context_pre_only), width 64, 4 heads of 16.
Vchitect_tiny = _register_vchitect("Vchitect-tiny", depth=2, hidden_size=64, num_heads=4,
                                   caption_channels=32, model_max_length=8)
