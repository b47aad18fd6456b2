"""The tiny random pipeline of Flux dev's released layout (``flux``), for tests and
``scripts/make_tiny_pipeline.py``."""

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


def build_flux(seed: int = 0):
    """Flux dev (``FluxPipeline``): CLIP-L's pooled output (16 wide) and T5 (32 wide, 512 tokens), the
    guidance-distilled transformer, the VAE's 0.3611 scale and 0.1159 shift, token-count shift
    (0.5 at 256 tokens .. 1.15 at 4096)."""
    from diffusers import FluxPipeline

    tokenizer, tokenizer_2 = clip_tokenizer(), t5_tokenizer()
    transformer = random_transformer(
        "FluxTransformer2DModel", seed, patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16,
        guidance_embeds=True, axes_dims_rope=[2, 2, 4])
    scheduler = flow_scheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                               base_image_seq_len=256, max_image_seq_len=4096)
    vae = kl_image_vae(seed + 1, 0.3611, 0.1159)
    torch.manual_seed(seed + 2)
    return FluxPipeline(tokenizer=tokenizer, text_encoder=clip_encoder(tokenizer, 16), tokenizer_2=tokenizer_2,
                        text_encoder_2=t5_encoder(tokenizer_2, 32), transformer=transformer, vae=vae,
                        scheduler=scheduler)


TINY = (TinyPipeline("flux", build_flux, dict(height=32, width=32, num_inference_steps=2)),)
