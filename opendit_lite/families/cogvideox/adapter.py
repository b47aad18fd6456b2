"""CogVideoX's adapter: its forward inputs from a clip batch and its published training recipe:
v-prediction on a DDPM schedule, uniform training steps, SNR shift 1 (the 5B and
1.5 models); the model takes the integer step.
"""

from typing import Mapping

import torch

from ..adapter_base import FamilyAdapter, Recipe


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
