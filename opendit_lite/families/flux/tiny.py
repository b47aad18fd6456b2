"""The tiny random pipelines of Flux dev's released layout (``flux``) and of FLUX.1 Kontext dev's
(``flux_kontext``: the same parts in ``FluxKontextPipeline``), for tests and ``scripts/make_tiny_pipeline.py``."""

import torch

from ..tiny_parts import (
    TinyPipeline,
    clip_encoder,
    clip_tokenizer,
    flow_scheduler,
    kl_image_vae,
    random_transformer,
    t5_encoder,
    t5_tokenizer,
)


def _flux_parts(seed: int) -> dict:
    """The components of Flux dev and Kontext dev: CLIP-L's pooled output (16 wide) and T5 (32 wide, 512
    tokens), the guidance-distilled transformer, the VAE's 0.3611 scale and 0.1159 shift, token-count
    shift (0.5 at 256 tokens .. 1.15 at 4096)."""
    tokenizer, tokenizer_2 = clip_tokenizer(), t5_tokenizer()
    transformer = random_transformer(
        "FluxTransformer2DModel", seed, patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16,
        guidance_embeds=True, axes_dims_rope=[2, 2, 4])
    scheduler = flow_scheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                               base_image_seq_len=256, max_image_seq_len=4096)
    vae = kl_image_vae(seed + 1, 0.3611, 0.1159)
    torch.manual_seed(seed + 2)
    return dict(tokenizer=tokenizer, text_encoder=clip_encoder(tokenizer, 16), tokenizer_2=tokenizer_2,
                text_encoder_2=t5_encoder(tokenizer_2, 32), transformer=transformer, vae=vae, scheduler=scheduler)


def build_flux(seed: int = 0):
    """Flux dev (``FluxPipeline``)."""
    from diffusers import FluxPipeline

    return FluxPipeline(**_flux_parts(seed))


def build_flux_kontext(seed: int = 0):
    """FLUX.1 Kontext dev (``FluxKontextPipeline``): Flux dev's parts; no IP-adapter image encoder."""
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(**_flux_parts(seed))


# Kontext renders at about one megapixel unless ``max_area`` says otherwise; its calls also need ``image=``.
TINY = (TinyPipeline("flux", build_flux, dict(height=32, width=32, num_inference_steps=2)),
        TinyPipeline("flux_kontext", build_flux_kontext,
                     dict(height=32, width=32, max_area=32 * 32, num_inference_steps=2)))
