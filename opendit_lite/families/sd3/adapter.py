"""SD3 / SD3.5's adapter: its forward inputs from a clip batch and its published training recipe:
flow matching, logit-normal training times, shift 3; timestep ``t x 1000``.
"""

from ..adapter_base import FamilyAdapter, Recipe


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
