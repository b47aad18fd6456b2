"""The tiny random pipeline of LTX-Video's released layout (``ltx``), for tests and
``scripts/make_tiny_pipeline.py``."""

import torch

from ..tiny_parts import TinyPipeline, diffusers_model, flow_scheduler, random_transformer, t5_encoder, t5_tokenizer


def build_ltx(seed: int = 0):
    """LTX-Video (``LTXPipeline``): T5 (32 wide, 128 tokens), its VAE (8 latent channels with a
    per-channel mean and std; 4x in time and space here, 8x32x32 in the release), the release's
    token-count shift (0.95 at 1024 tokens .. 2.05 at 4096, terminal sigma 0.1)."""
    from diffusers import LTXPipeline

    tokenizer = t5_tokenizer(max_length=128)
    transformer = random_transformer(
        "LTXVideoTransformer3DModel", seed, in_channels=8, out_channels=8, num_attention_heads=2,
        attention_head_dim=8, cross_attention_dim=16, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=32)
    vae = diffusers_model("AutoencoderKLLTXVideo", seed + 1, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                          decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                          decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
                          decoder_spatio_temporal_scaling=(True, True, False, False),
                          decoder_inject_noise=(False,) * 5, upsample_residual=(False,) * 4,
                          upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1, patch_size_t=1,
                          encoder_causal=True, decoder_causal=False, scaling_factor=1.0)
    with torch.no_grad():  # the statistics are buffers, saved with the weights; the release's are not 0 and 1
        vae.latents_mean.copy_(torch.linspace(-0.3, 0.3, vae.latents_mean.numel()))
        vae.latents_std.copy_(torch.linspace(0.5, 2.0, vae.latents_std.numel()))
    scheduler = flow_scheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                               base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1)
    torch.manual_seed(seed + 2)
    return LTXPipeline(tokenizer=tokenizer, text_encoder=t5_encoder(tokenizer, 32), vae=vae.eval(),
                       transformer=transformer, scheduler=scheduler)


TINY = (TinyPipeline("ltx", build_ltx, dict(height=32, width=32, num_frames=9, num_inference_steps=2)),)
