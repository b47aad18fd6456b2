"""The tiny random pipeline of CogVideoX 5B's released layout (``cogvideox``), for tests and
``scripts/make_tiny_pipeline.py``."""

import torch

from ..tiny_parts import TinyPipeline, diffusers_model, random_transformer, t5_encoder, t5_tokenizer


def build_cogvideox(seed: int = 0):
    """CogVideoX 5B (``CogVideoXPipeline``): T5 (32 wide, 226 tokens), 3-D rotary embedding on a base
    grid of 4x6 patches, its VAE (scaling 0.7), v-prediction DDIM with zero terminal SNR, SNR shift 1."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXPipeline

    tokenizer = t5_tokenizer(max_length=226)
    transformer = random_transformer(
        "CogVideoXTransformer3DModel", seed, num_attention_heads=2, attention_head_dim=16, in_channels=4,
        out_channels=4, time_embed_dim=4, text_embed_dim=32, num_layers=2, sample_width=12, sample_height=8,
        sample_frames=5, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=226,
        use_rotary_positional_embeddings=True)
    vae = diffusers_model("AutoencoderKLCogVideoX", seed + 1, block_out_channels=(8, 8, 8),
                          down_block_types=("CogVideoXDownBlock3D",) * 3, up_block_types=("CogVideoXUpBlock3D",) * 3,
                          latent_channels=4, layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4,
                          scaling_factor=0.7)
    scheduler = CogVideoXDDIMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=True,
        prediction_type="v_prediction", rescale_betas_zero_snr=True, snr_shift_scale=1.0, timestep_spacing="trailing")
    torch.manual_seed(seed + 2)
    return CogVideoXPipeline(tokenizer=tokenizer, text_encoder=t5_encoder(tokenizer, 32), vae=vae.eval(),
                             transformer=transformer, scheduler=scheduler)


TINY = (TinyPipeline("cogvideox", build_cogvideox, dict(height=32, width=32, num_frames=9, num_inference_steps=2)),)
