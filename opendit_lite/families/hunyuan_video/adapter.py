"""HunyuanVideo's adapter: its forward inputs from a clip batch and its published training recipe:
flow matching, uniform training times, shift 7; timestep ``t x 1000``. The guidance
embedding of guidance-distilled configs is given ``GUIDANCE`` = 1 x 1000 (HunyuanVideo expects it
scaled), the value its LoRA fine-tuning recipes train with.
"""

import torch

from ..adapter_base import FamilyAdapter, Recipe

# The guidance embedding's value in training (guidance-distilled checkpoints).
GUIDANCE = 1.0


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
