"""Wan 2.x's adapter: its forward inputs from a clip batch and its published training recipe:
flow matching, uniform training times, shift 5 (as Wan 2.x trains and samples); timestep ``t x 1000``.
"""

from ..adapter_base import FamilyAdapter, Recipe


class WanAdapter(FamilyAdapter):
    """Wan 2.x: clips [B, C, T, H, W] as they are; no text mask (padding tokens are zero, as Wan's
    pipeline pads its T5 states)."""

    class_name = "WanTransformer3DModel"
    text_width_key = "text_dim"

    def recipe(self, config, tokens):
        return Recipe("rflow", "uniform", 5.0)

    def latent_channels(self, config):
        # image-to-video transformers take the condition channels too (in_channels 36); they denoise out_channels
        return int(config.get("out_channels") or config["in_channels"])

    def patch_size(self, config):
        return tuple(int(v) for v in config["patch_size"])

    def forward(self, model, config, x, t, states, mask, pooled):
        return model(hidden_states=x, timestep=t, encoder_hidden_states=states, return_dict=False)[0]
