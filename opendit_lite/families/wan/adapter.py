"""Wan 2.x's adapter: its forward inputs from a clip batch and its published training recipe:
flow matching, uniform training times, shift 5 (as Wan 2.x trains and samples); timestep ``t x 1000``.
"""

import torch

from ...errors import ConfigError
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

    def needs_pipeline(self, config):
        if int(config["in_channels"]) == self.latent_channels(config):
            return ""
        return (f"{self.class_name} with in_channels={config['in_channels']} is an image-to-video transformer: it "
                f"trains on the images its pipeline encodes. Give the pipeline folder (model.pipeline, a "
                f"WanImageToVideoPipeline) instead of model.path, with the clips (their first frames are the images).")

    def forward(self, model, config, x, t, states, mask, pooled):
        if int(config["in_channels"]) == x.shape[1]:
            return model(hidden_states=x, timestep=t, encoder_hidden_states=states, return_dict=False)[0]
        # An image-to-video transformer (36 channels: the latents, then 4 mask + 16 condition channels; Wan 2.1:
        # CLIP image states too). Its images come from its pipeline (model.pipeline: conditioning_i2v.py); here
        # there is none, so only the planner's meta-device forwards run, with the inputs' shapes (a run is
        # refused when it is built: needs_pipeline).
        if not x.is_meta:
            raise ConfigError(self.needs_pipeline(config))
        B = x.shape[0]
        condition = x.new_zeros(B, int(config["in_channels"]) - x.shape[1], *x.shape[2:])    # [B, 20, T, h, w]
        image = None
        if config.get("image_dim") is not None:  # CLIP ViT-H/14's 257 tokens per image
            pairs = config.get("pos_embed_seq_len")  # FLF2V: first and last image's states, one row each
            rows, tokens = (2 * B, int(pairs) // 2) if pairs else (B, 257)
            image = states.new_zeros(rows, tokens, int(config["image_dim"]))                # [B, 257, 1280]
        return model(hidden_states=torch.cat([x, condition], dim=1), timestep=t, encoder_hidden_states=states,
                     encoder_hidden_states_image=image, return_dict=False)[0]
