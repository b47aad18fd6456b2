"""LTX-Video's adapter: its forward inputs from a clip batch and its published training recipe:
flow matching, logit-normal training times, shift by token count (e^0.95 at 1024
tokens .. e^2.05 at 4096); timestep ``t x 1000``.
"""

from ...diffusion.rectified_flow import resolution_shift
from ..adapter_base import FamilyAdapter, Recipe, pack_patches, unpack_patches


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
        out = model(hidden_states=pack_patches(x, pt, p), encoder_hidden_states=states, timestep=t,  # [B, N, C pt p p]
                    encoder_attention_mask=mask.long(), num_frames=T // pt, height=H // p, width=W // p,
                    return_dict=False)[0]
        return unpack_patches(out, x.shape, pt, p)                                                  # [B, C, T, H, W]
