"""Tiny random pipelines of Wan's released layouts, for tests and ``scripts/make_tiny_pipeline.py``:
Wan 2.1 text-to-video (``wan``) and Wan 2.2 A14B with its two experts (``wan22``)."""

import torch

from ..tiny_parts import TinyPipeline, diffusers_model, random_transformer, t5_encoder, t5_tokenizer


def _wan_parts(seed: int) -> dict:
    """Wan 2.x's shared parts: UMT5 (32 wide), the 16-channel Wan VAE with the release's per-channel
    latent mean and std (its defaults; 4x in time and space here, 4x8x8 in the release)."""
    tokenizer = t5_tokenizer()
    vae = diffusers_model("AutoencoderKLWan", seed + 1, base_dim=8, z_dim=16, dim_mult=[1, 1, 1], num_res_blocks=1,
                          temperal_downsample=[True, True], scale_factor_temporal=4, scale_factor_spatial=4)
    torch.manual_seed(seed + 2)
    return dict(tokenizer=tokenizer, text_encoder=t5_encoder(tokenizer, 32, umt5=True), vae=vae.eval())


_WAN_TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
                        out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                        qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def _unipc_flow(shift: float):
    """Wan's scheduler: UniPC on flow sigmas with the release's ``flow_shift``."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift,
                                   num_train_timesteps=1000)


def build_wan(seed: int = 0):
    """Wan 2.1 text-to-video (``WanPipeline``): UMT5, Wan VAE, UniPC with flow shift 3 (480p)."""
    from diffusers import WanPipeline

    return WanPipeline(transformer=random_transformer("WanTransformer3DModel", seed, **_WAN_TRANSFORMER),
                       scheduler=_unipc_flow(3.0), **_wan_parts(seed))


def build_wan22(seed: int = 0):
    """Wan 2.2 A14B text-to-video: two experts, ``transformer`` for times at or above
    ``boundary_ratio`` x 1000 (high noise) and ``transformer_2`` below it; flow shift 12."""
    from diffusers import WanPipeline

    return WanPipeline(transformer=random_transformer("WanTransformer3DModel", seed, **_WAN_TRANSFORMER),
                       transformer_2=random_transformer("WanTransformer3DModel", seed + 7, **_WAN_TRANSFORMER),
                       boundary_ratio=0.875, scheduler=_unipc_flow(12.0), **_wan_parts(seed))


TINY = (TinyPipeline("wan", build_wan, dict(height=32, width=32, num_frames=5, num_inference_steps=2)),
        TinyPipeline("wan22", build_wan22, dict(height=32, width=32, num_frames=5, num_inference_steps=3)))
