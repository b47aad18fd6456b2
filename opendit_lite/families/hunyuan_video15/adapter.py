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

The planner counts activations from a forward on the meta device, and the model's own forward reads
its inputs' values twice before its blocks: whether the image states are all zero (text-to-video: the
image tokens are then zeroed and masked) and, per sample, which text tokens the masks keep (valid
caption, glyph and image tokens moved before the masked ones). ``counting_forward`` runs the model's
own modules in its forward's order with that selection done by shape, which ``forward``'s inputs fix
(the glyph and image tokens masked, one each; the planner's caption all valid): the joined text stream
is [caption (M), image (1), glyph zeroed (1)] with the mask [1 x M, 0, 0]: the same output and gradients
(tests/plan/test_hunyuan_video15_plan.py compares it with ``forward`` on the CPU).
"""

import torch
import torch.nn as nn

from ..adapter_base import FamilyAdapter, Recipe


def condition_channels(x: torch.Tensor) -> torch.Tensor:
    """Latents x [B, C, T, h, w] -> [x, condition latents, condition mask] [B, 2C + 1, T, h, w], the
    condition zero (text-to-video, as ``prepare_cond_latents_and_mask`` of ``HunyuanVideo15Pipeline``)."""
    B, C, T, h, w = x.shape
    return torch.cat([x, x.new_zeros(B, C + 1, T, h, w)], dim=1)


def meta_safe_forward(model: nn.Module, config, hidden: torch.Tensor, t: torch.Tensor, states: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """hidden [B, 2C + 1, T, H, W] (latents with their condition channels), t [B], states [B, M, W] with
    ``mask`` [B, M] all valid -> the prediction [B, C, T, H, W], as the model's forward gives it for
    ``HunyuanVideo15Adapter.forward``'s inputs, without reading a value."""
    B, _, T, H, W = hidden.shape
    pt, p = int(config["patch_size_t"]), int(config["patch_size"])
    t = t.to(hidden.dtype)
    rotary = model.rope(hidden)                                                  # (cos, sin) [N, head dim]
    temb = model.time_embed(t, timestep_r=None)                                  # [B, D]
    hidden = model.x_embedder(hidden)                                            # [B, N, D]

    text = model.context_embedder(states, t, mask.to(t.dtype))                   # [B, M, D]
    text = text + model.cond_type_embed(torch.zeros_like(text[:, :, 0], dtype=torch.long))
    glyph = model.context_embedder_2(t.new_zeros(B, 1, int(config["text_embed_2_dim"])))   # [B, 1, D]
    glyph = glyph + model.cond_type_embed(torch.ones_like(glyph[:, :, 0], dtype=torch.long))
    image = model.image_embedder(t.new_zeros(B, 1, int(config["image_embed_dim"]))) * 0.0   # [B, 1, D]: t2v
    image = image + model.cond_type_embed(2 * torch.ones_like(image[:, :, 0], dtype=torch.long))
    # [valid glyph (none), valid caption, masked image, masked glyph zeroed], as the forward orders them
    text = torch.cat([glyph[:, :0], text, image, torch.zeros_like(glyph)], dim=1)  # [B, M + 2, D]
    text_mask = torch.cat([mask.bool(), mask.new_zeros(B, 2, dtype=torch.bool)], dim=1)  # [B, M + 2]

    for block in model.transformer_blocks:
        hidden, text = block(hidden, text, temb, text_mask, rotary)
    hidden = model.proj_out(model.norm_out(hidden, temb))                        # [B, N, pt p p C]
    out = hidden.reshape(B, T // pt, H // p, W // p, -1, pt, p, p)
    out = out.permute(0, 4, 1, 5, 2, 6, 3, 7)                                     # [B, C, T', pt, H', p, W', p]
    return out.flatten(6, 7).flatten(4, 5).flatten(2, 3)                         # [B, C, T, H, W]


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

    def counting_forward(self, model, config, x, t, states, mask, pooled):
        return meta_safe_forward(model, config, condition_channels(x), t, states, mask)
