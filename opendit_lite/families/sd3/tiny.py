"""The tiny random pipeline of SD3 medium's released layout (``sd3``), for tests and
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


def build_sd3(seed: int = 0):
    """SD3 medium (``StableDiffusion3Pipeline``): CLIP-L (12 wide, projection 8) and CLIP-G (16 wide,
    projection 12), whose second-to-last states are joined and padded to T5's 32 (77 + 256 tokens)
    and whose projections make the 20-wide pooled text; the VAE's 1.5305 scale and 0.0609 shift,
    flow shift 3."""
    from diffusers import StableDiffusion3Pipeline

    tokenizer, tokenizer_2, tokenizer_3 = clip_tokenizer(), clip_tokenizer(), t5_tokenizer()
    transformer = random_transformer(
        "SD3Transformer2DModel", seed, sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=32,
        pooled_projection_dim=20, pos_embed_max_size=32)
    vae = kl_image_vae(seed + 1, 1.5305, 0.0609)
    torch.manual_seed(seed + 2)
    return StableDiffusion3Pipeline(
        tokenizer=tokenizer, text_encoder=clip_encoder(tokenizer, 12, projection=8), tokenizer_2=tokenizer_2,
        text_encoder_2=clip_encoder(tokenizer_2, 16, projection=12), tokenizer_3=tokenizer_3,
        text_encoder_3=t5_encoder(tokenizer_3, 32), transformer=transformer, vae=vae,
        scheduler=flow_scheduler(shift=3.0))


TINY = (TinyPipeline("sd3", build_sd3, dict(height=32, width=32, num_inference_steps=2)),)
