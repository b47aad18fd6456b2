"""The six diffusers families' adapters: each family's forward inputs from a clip batch and its
published training recipe.

Recipes (objective, training-time distribution, shift), as each family's release trains and samples:

| family | objective | times | shift |
|---|---|---|---|
| Wan 2.x | flow matching | uniform | 5 |
| HunyuanVideo | flow matching | uniform | 7 |
| LTX-Video | flow matching | logit-normal | by token count: e^0.95 at 1024 tokens .. e^2.05 at 4096 |
| SD3 / SD3.5 | flow matching | logit-normal | 3 |
| Flux | flow matching | logit-normal | by token count: e^0.5 at 256 tokens .. e^1.15 at 4096 |
| CogVideoX | v-prediction, DDPM schedule | uniform steps | SNR shift 1 (the 5B and 1.5 models) |

Timestep scales: every flow model but Flux takes ``t x 1000`` (what ``RectifiedFlow`` passes); Flux
multiplies by 1000 itself and takes ``t``; CogVideoX takes the integer step. Flux's and
HunyuanVideo's guidance embedding (guidance-distilled checkpoints) is given ``GUIDANCE`` = 1, the
value their LoRA fine-tuning recipes train with (Flux scales it by 1000 inside, HunyuanVideo
expects it scaled).
"""

from typing import Mapping, Tuple

import torch

from ..diffusion.rectified_flow import resolution_shift
from .registry import FamilyAdapter, Recipe, register_family

GUIDANCE = 1.0


def _pack(x: torch.Tensor, pt: int, p: int) -> torch.Tensor:
    """[B, C, T, H, W] -> [B, (T/pt)(H/p)(W/p), C pt p p]: tokens in (frame, row, column) order,
    each holding its channels then its patch's (pt, p, p) positions (LTX-Video's and Flux's packing)."""
    B, C, T, H, W = x.shape
    x = x.reshape(B, C, T // pt, pt, H // p, p, W // p, p)
    return x.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


def _unpack(tokens: torch.Tensor, shape: Tuple[int, ...], pt: int, p: int) -> torch.Tensor:
    """The inverse of ``_pack`` for a clip of ``shape`` (B, C, T, H, W)."""
    B, C, T, H, W = shape
    x = tokens.reshape(B, T // pt, H // p, W // p, C, pt, p, p)
    return x.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(B, C, T, H, W)


@register_family
class WanAdapter(FamilyAdapter):
    """Wan 2.x: clips [B, C, T, H, W] as they are; no text mask (padding tokens are zero, as Wan's
    pipeline pads its T5 states)."""

    class_name = "WanTransformer3DModel"
    text_width_key = "text_dim"

    def recipe(self, config, tokens):
        return Recipe("rflow", "uniform", 5.0)

    def patch_size(self, config):
        return tuple(int(v) for v in config["patch_size"])

    def forward(self, model, config, x, t, states, mask, pooled):
        return model(hidden_states=x, timestep=t, encoder_hidden_states=states, return_dict=False)[0]

    def modulated_input(self, block, args, kwargs):
        """What ``WanTransformerBlock`` feeds its self-attention: norm1 of the tokens modulated by the
        block's shift/scale (``scale_shift_table + temb``; per token with Wan 2.2's [B, N, 6, D] temb)."""
        kwargs = kwargs or {}
        names = ("hidden_states", "encoder_hidden_states", "temb")
        hidden, _, temb = (kwargs[n] if n in kwargs else args[i] for i, n in enumerate(names))
        if temb.ndim == 4:                                                    # [B, N, 6, D]
            shift, scale = (block.scale_shift_table.unsqueeze(0) + temb.float()).unbind(2)[:2]
        else:                                                                 # [B, 6, D]
            shift, scale = (block.scale_shift_table + temb.float()).chunk(6, dim=1)[:2]
        return block.norm1(hidden.float()) * (1 + scale) + shift              # [B, N, D]


@register_family
class HunyuanVideoAdapter(FamilyAdapter):
    """HunyuanVideo: clips as they are, the caption with its attention mask, pooled text (CLIP's
    in the release) and, for guidance-distilled configs, the guidance embedding (x 1000)."""

    class_name = "HunyuanVideoTransformer3DModel"
    text_width_key = "text_embed_dim"
    pooled_width_key = "pooled_projection_dim"

    def recipe(self, config, tokens):
        return Recipe("rflow", "uniform", 7.0)

    def patch_size(self, config):
        return int(config["patch_size_t"]), int(config["patch_size"]), int(config["patch_size"])

    def guidance_distilled(self, config):
        return bool(config.get("guidance_embeds"))

    def forward(self, model, config, x, t, states, mask, pooled):
        guidance = torch.full_like(t, GUIDANCE * 1000.0) if config.get("guidance_embeds") else None
        return model(hidden_states=x, timestep=t, encoder_hidden_states=states, encoder_attention_mask=mask,
                     pooled_projections=pooled, guidance=guidance, return_dict=False)[0]


@register_family
class LTXVideoAdapter(FamilyAdapter):
    """LTX-Video: clips packed into tokens (the model's patch sizes; its ``proj_in`` takes
    C x pt x p x p channels), the latent grid passed as num_frames/height/width, the caption mask."""

    class_name = "LTXVideoTransformer3DModel"
    text_width_key = "caption_channels"

    def recipe(self, config, tokens):
        return Recipe("rflow", "logit-normal", resolution_shift(tokens, 1024, 4096, 0.95, 2.05))

    def patch_size(self, config):
        return int(config["patch_size_t"]), int(config["patch_size"]), int(config["patch_size"])

    def latent_channels(self, config):
        pt, p, _ = self.patch_size(config)
        return int(config["in_channels"]) // (pt * p * p)

    def forward(self, model, config, x, t, states, mask, pooled):
        pt, p, _ = self.patch_size(config)
        B, C, T, H, W = x.shape
        out = model(hidden_states=_pack(x, pt, p), encoder_hidden_states=states, timestep=t,       # [B, N, C pt p p]
                    encoder_attention_mask=mask.long(), num_frames=T // pt, height=H // p, width=W // p,
                    return_dict=False)[0]
        return _unpack(out, x.shape, pt, p)                                                       # [B, C, T, H, W]


@register_family
class SD3Adapter(FamilyAdapter):
    """SD3 / SD3.5: an image model; 1-frame clips [B, C, 1, H, W] as images, pooled text (the two
    CLIPs' in the release); no text mask (padding tokens are zero)."""

    class_name = "SD3Transformer2DModel"
    text_width_key = "joint_attention_dim"
    pooled_width_key = "pooled_projection_dim"
    image_only = True

    def recipe(self, config, tokens):
        return Recipe("rflow", "logit-normal", 3.0)

    def patch_size(self, config):
        return 1, int(config["patch_size"]), int(config["patch_size"])

    def forward(self, model, config, x, t, states, mask, pooled):
        out = model(hidden_states=x[:, :, 0], encoder_hidden_states=states, pooled_projections=pooled, timestep=t,
                    return_dict=False)[0]                                                         # [B, C, H, W]
        return out.unsqueeze(2)                                                                   # [B, C, 1, H, W]


@register_family
class FluxAdapter(FamilyAdapter):
    """Flux: an image model; 1-frame clips packed in 2x2 patches (Flux's ``in_channels`` is 4 x the
    latent channels), rotary ids (0, row, column) for the image tokens and zeros for the text,
    pooled text (CLIP's in the release), the guidance embedding for guidance-distilled (dev)
    configs; the time t in [0, 1]; no text mask (padding tokens are zero)."""

    class_name = "FluxTransformer2DModel"
    text_width_key = "joint_attention_dim"
    pooled_width_key = "pooled_projection_dim"
    image_only = True

    def recipe(self, config, tokens):
        return Recipe("rflow", "logit-normal", resolution_shift(tokens, 256, 4096, 0.5, 1.15))

    def patch_size(self, config):
        return 1, 2, 2

    def latent_channels(self, config):
        return int(config["in_channels"]) // 4

    def guidance_distilled(self, config):
        return bool(config.get("guidance_embeds"))

    def forward(self, model, config, x, t, states, mask, pooled):
        B, C, T, H, W = x.shape
        rows, cols = torch.meshgrid(torch.arange(H // 2, device=x.device), torch.arange(W // 2, device=x.device),
                                    indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3).to(x.dtype)  # [N, 3]
        txt_ids = torch.zeros(states.shape[1], 3, device=x.device, dtype=x.dtype)                       # [M, 3]
        guidance = torch.full_like(t, GUIDANCE) if config.get("guidance_embeds") else None
        out = model(hidden_states=_pack(x, 1, 2), timestep=t / 1000, guidance=guidance, pooled_projections=pooled,
                    encoder_hidden_states=states, txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]  # [B, N, 4C]
        return _unpack(out, x.shape, 1, 2)                                                    # [B, C, 1, H, W]


@register_family
class CogVideoXAdapter(FamilyAdapter):
    """CogVideoX (1.0 and 1.5): clips in its [B, T, C, H, W] layout, the integer timestep, the
    caption padded or cut to its ``max_text_seq_length`` (its positional table holds that many
    text tokens; no text mask: padding is zero); the 3-D rotary table when the config uses one, and
    the ``ofs`` embedding (2.0, as its pipeline) when it has one."""

    class_name = "CogVideoXTransformer3DModel"
    text_width_key = "text_embed_dim"

    def recipe(self, config, tokens):
        return Recipe("vpred", "uniform", 1.0)

    def patch_size(self, config):
        return int(config.get("patch_size_t") or 1), int(config["patch_size"]), int(config["patch_size"])

    def forward(self, model, config, x, t, states, mask, pooled):
        B, C, T, H, W = x.shape
        M = int(config["max_text_seq_length"])
        states = states[:, :M] if states.shape[1] >= M else torch.cat(
            [states, states.new_zeros(B, M - states.shape[1], states.shape[2])], dim=1)            # [B, M', W]
        rope = config.get("use_rotary_positional_embeddings")
        rotary = _cogvideox_rotary(config, T, H, W, x.device) if rope else None
        ofs = torch.full_like(t, 2.0, dtype=x.dtype) if config.get("ofs_embed_dim") else None
        out = model(hidden_states=x.transpose(1, 2), encoder_hidden_states=states, timestep=t.long(),  # [B, T, C, H, W]
                    image_rotary_emb=rotary, ofs=ofs, return_dict=False)[0]
        return out.transpose(1, 2)                                                                    # [B, C, T, H, W]


def _cogvideox_rotary(config: Mapping, frames: int, height: int, width: int, device) -> tuple:
    """(cos, sin) of CogVideoX's 3-D rotary table for a latent clip, as its pipeline builds it
    (1.5, with temporal patches: "slice" grids at the clip's own size; 1.0: crops of the base grid)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed  # the model's own table, lazily

    pt, p, _ = CogVideoXAdapter().patch_size(config)
    rows, cols = height // p, width // p
    base_rows, base_cols = config["sample_height"] // p, config["sample_width"] // p
    if config.get("patch_size_t"):
        cos, sin = get_3d_rotary_pos_embed(embed_dim=config["attention_head_dim"], crops_coords=None,
                                           grid_size=(rows, cols), temporal_size=frames // pt, grid_type="slice",
                                           max_size=(max(rows, base_rows), max(cols, base_cols)), device=device)
    else:
        cos, sin = get_3d_rotary_pos_embed(embed_dim=config["attention_head_dim"],
                                           crops_coords=_crop_region(rows, cols, base_cols, base_rows),
                                           grid_size=(rows, cols), temporal_size=frames, device=device)
    return cos, sin


def _crop_region(rows: int, cols: int, base_cols: int, base_rows: int):
    """The centred crop of the base grid that CogVideoX's pipeline resizes a (rows, cols) grid into."""
    ratio = rows / cols
    if ratio > base_rows / base_cols:
        new_rows, new_cols = base_rows, int(round(base_rows / rows * cols))
    else:
        new_cols, new_rows = base_cols, int(round(base_cols / cols * rows))
    top, left = int(round((base_rows - new_rows) / 2.0)), int(round((base_cols - new_cols) / 2.0))
    return (top, left), (top + new_rows, left + new_cols)

