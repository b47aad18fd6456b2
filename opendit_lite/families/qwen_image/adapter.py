"""Qwen-Image's adapter: its forward inputs from a clip batch and its training recipe: flow matching,
logit-normal training times, shifted by token count as its scheduler shifts sampling (e^0.5 at 256
tokens .. e^0.9 at 8192, the release's ``scheduler_config.json``). The transformer takes the time
t in [0, 1] (the pipeline passes ``timestep / 1000``), 2x2 patches packed into channels, the caption's
key mask and the patch grid (``img_shapes``) its rotary table is built for; no pooled text and no
guidance embedding.
"""


from ...diffusion.rectified_flow import resolution_shift
from ..adapter_base import FamilyAdapter, Recipe, pack_patches, unpack_patches


class QwenImageAdapter(FamilyAdapter):
    """Qwen-Image (``QwenImageTransformer2DModel``): an image model; 1-frame clips packed in 2x2 patches
    (``in_channels`` is 4 x the latent channels), joint [text, image] attention with the text's key mask."""

    class_name = "QwenImageTransformer2DModel"
    text_width_key = "joint_attention_dim"
    pooled_width_key = None
    image_only = True

    def recipe(self, config, tokens):
        return Recipe("rflow", "logit-normal", resolution_shift(tokens, 256, 8192, 0.5, 0.9))

    def patch_size(self, config):
        return 1, 2, 2

    def latent_channels(self, config):
        return int(config["in_channels"]) // 4

    def forward(self, model, config, x, t, states, mask, pooled):
        B, C, T, H, W = x.shape
        out = model(hidden_states=pack_patches(x, 1, 2), timestep=t / 1000, encoder_hidden_states=states,
                    encoder_hidden_states_mask=mask, img_shapes=[[(1, H // 2, W // 2)]] * B,
                    return_dict=False)[0]                                                     # [B, N, 4C]
        return unpack_patches(out, x.shape, 1, 2)                                             # [B, C, 1, H, W]
