"""HunyuanVideo 1.5's adapter (diffusers' ``HunyuanVideo15Transformer3DModel``): its forward inputs from
a clip batch and its training recipe: flow matching, uniform training times, shift 5 (the shift the
480p release's scheduler samples with; a run from a pipeline folder takes its scheduler's own);
timestep ``t x 1000``, as the pipeline passes its scheduler's timesteps.

The model denoises 32-channel latents (``out_channels``) but takes ``2 x 32 + 1`` input channels:
the latents, the condition latents and the condition mask, zero for text-to-video (what
``HunyuanVideo15Pipeline.prepare_cond_latents_and_mask`` gives). Its text stream joins three
sources: the caption states (Qwen2.5-VL's, ``encoder_hidden_states``), ByT5's states of the quoted
glyph text (``encoder_hidden_states_2``) and SigLIP's image states (``image_embeds``); a caption
without quoted text has no valid ByT5 token and text-to-video has no valid image token. Masked
tokens are moved behind the valid ones and attended by nothing, so one masked zero token of each
gives the image tokens exactly what the pipeline's 256 ByT5 and 729 image tokens give them.
"""

import torch

from ..adapter_base import FamilyAdapter, Recipe


def condition_channels(x: torch.Tensor) -> torch.Tensor:
    """Latents x [B, C, T, h, w] -> [x, condition latents, condition mask] [B, 2C + 1, T, h, w], the
    condition zero (text-to-video, as ``prepare_cond_latents_and_mask`` of ``HunyuanVideo15Pipeline``)."""
    B, C, T, h, w = x.shape
    return torch.cat([x, x.new_zeros(B, C + 1, T, h, w)], dim=1)


class HunyuanVideo15Adapter(FamilyAdapter):
    """HunyuanVideo 1.5: the caption states with their mask, no glyph text, no image, condition channels zero."""

    class_name = "HunyuanVideo15Transformer3DModel"
    text_width_key = "text_embed_dim"
    pooled_width_key = None

    def recipe(self, config, tokens):
        return Recipe("rflow", "uniform", 5.0)

    def patch_size(self, config):
        return int(config["patch_size_t"]), int(config["patch_size"]), int(config["patch_size"])

    def latent_channels(self, config):
        return int(config["out_channels"])

    def forward(self, model, config, x, t, states, mask, pooled):
        B = x.shape[0]
        glyph = x.new_zeros(B, 1, int(config["text_embed_2_dim"]))                   # [B, 1, W2], masked
        image = x.new_zeros(B, 1, int(config["image_embed_dim"]))                    # [B, 1, Wi], zero: no image
        return model(hidden_states=condition_channels(x), timestep=t.to(x.dtype), encoder_hidden_states=states,
                     encoder_attention_mask=mask.to(x.dtype), encoder_hidden_states_2=glyph,
                     encoder_attention_mask_2=x.new_zeros(B, 1), image_embeds=image, return_dict=False)[0]
