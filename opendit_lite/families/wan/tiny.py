"""Tiny random pipelines of Wan's released layouts, for tests and ``scripts/make_tiny_pipeline.py``:
Wan 2.1 text-to-video (``wan``), Wan 2.2 A14B with its two experts (``wan22``), Wan 2.1 image-to-video
with its CLIP image encoder (``wan_i2v``), Wan 2.1 first-and-last-frame-to-video (``wan_flf2v``), Wan
2.2 I2V-A14B (``wan22_i2v``) and Wan 2.2 TI2V-5B with its 48-channel VAE (``wan_ti2v``; as
image-to-video: ``wan_ti2v_i2v``)."""

import torch

from ..tiny_parts import TinyPipeline, diffusers_model, random_transformer, t5_encoder, t5_tokenizer
from .conditioning_i2v import clean_prompts_without_ftfy


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


# ------------------------------------------------------------------------------------------ image-to-video

def _clip_vision(seed: int, width: int = 16):
    """Wan 2.1 I2V's image encoder at test size: a ``CLIPVisionModelWithProjection`` (the release's
    class, ViT-H/14 at 224 pixels there; 32 pixels in 8-pixel patches here, 17 tokens with the class
    token) and the ``CLIPImageProcessor`` that resizes and crops images for it (OpenAI CLIP's mean
    and std, bicubic), built offline."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.CLIPVisionConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=32, patch_size=8, projection_dim=width)
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return transformers.CLIPVisionModelWithProjection(config).eval(), processor


def build_wan_i2v(seed: int = 0):
    """Wan 2.1 image-to-video (``WanImageToVideoPipeline``, the 480P / 720P / FLF2V layout): the
    transformer takes 36 channels (16 noisy + 4 mask + 16 condition latents), CLIP image states
    (``image_dim``: the CLIP width; its own key/value projections in the cross-attention,
    ``added_kv_proj_dim`` = the inner width); UniPC with flow shift 3 (480p)."""
    from diffusers import WanImageToVideoPipeline

    clean_prompts_without_ftfy()  # its __call__ runs without ftfy installed
    image_encoder, image_processor = _clip_vision(seed + 5)
    transformer = random_transformer("WanTransformer3DModel", seed, **dict(
        _WAN_TRANSFORMER, in_channels=36, image_dim=16, added_kv_proj_dim=24))
    return WanImageToVideoPipeline(transformer=transformer, image_encoder=image_encoder,
                                   image_processor=image_processor, scheduler=_unipc_flow(3.0), **_wan_parts(seed))


def build_wan_flf2v(seed: int = 0):
    """Wan 2.1 first-and-last-frame-to-video (FLF2V-14B-720P's layout: a ``WanImageToVideoPipeline`` whose
    transformer adds a position embedding over the CLIP states of both images, ``pos_embed_seq_len`` = 2 x
    the CLIP tokens, 2 x 17 here); otherwise Wan 2.1 I2V's; flow shift 16 (the release's, 720p)."""
    from diffusers import WanImageToVideoPipeline

    clean_prompts_without_ftfy()
    image_encoder, image_processor = _clip_vision(seed + 5)
    transformer = random_transformer("WanTransformer3DModel", seed, **dict(
        _WAN_TRANSFORMER, in_channels=36, image_dim=16, added_kv_proj_dim=24, pos_embed_seq_len=34))
    return WanImageToVideoPipeline(transformer=transformer, image_encoder=image_encoder,
                                   image_processor=image_processor, scheduler=_unipc_flow(16.0), **_wan_parts(seed))


def build_wan22_i2v(seed: int = 0):
    """Wan 2.2 I2V-A14B (``WanImageToVideoPipeline``): two 36-channel experts split at
    ``boundary_ratio`` 0.9, no image encoder (the condition latents only); flow shift 5."""
    from diffusers import WanImageToVideoPipeline

    clean_prompts_without_ftfy()
    config = dict(_WAN_TRANSFORMER, in_channels=36)
    return WanImageToVideoPipeline(transformer=random_transformer("WanTransformer3DModel", seed, **config),
                                   transformer_2=random_transformer("WanTransformer3DModel", seed + 7, **config),
                                   boundary_ratio=0.9, scheduler=_unipc_flow(5.0), **_wan_parts(seed))


def _wan22_vae(seed: int):
    """Wan 2.2's 48-channel VAE (``AutoencoderKLWan`` with ``z_dim`` 48, residual blocks, 2x2 pixel
    patching into 12 channels, per-channel latent mean and std of 48 channels): 4x in time, 2 x 4 = 8x
    in space here (16x in the release)."""
    mean = [round(0.1 * ((7 * i) % 11 - 5), 3) for i in range(48)]
    std = [round(1.0 + 0.05 * (i % 9), 3) for i in range(48)]
    vae = diffusers_model("AutoencoderKLWan", seed, base_dim=8, z_dim=48, dim_mult=[1, 1, 1], num_res_blocks=1,
                          temperal_downsample=[True, True], is_residual=True, in_channels=12, out_channels=12,
                          patch_size=2, latents_mean=mean, latents_std=std, scale_factor_temporal=4,
                          scale_factor_spatial=8)
    return vae.eval()


def build_wan_ti2v(seed: int = 0):
    """Wan 2.2 TI2V-5B (its folder is a ``WanPipeline`` with ``expand_timesteps``; the same folder loads
    as ``WanImageToVideoPipeline`` for image-to-video): one 48-channel transformer on the 48-channel
    VAE's latents, per-token timesteps; flow shift 5."""
    from diffusers import WanPipeline

    parts = dict(_wan_parts(seed), vae=_wan22_vae(seed + 1))
    transformer = random_transformer("WanTransformer3DModel", seed, **dict(_WAN_TRANSFORMER, in_channels=48,
                                                                           out_channels=48))
    return WanPipeline(transformer=transformer, expand_timesteps=True, scheduler=_unipc_flow(5.0), **parts)


def build_wan_ti2v_i2v(seed: int = 0):
    """The TI2V-5B folder as ``WanImageToVideoPipeline`` (its image-to-video; the folder a run trains
    image-to-video from: the release's components under that pipeline class, ``expand_timesteps`` kept)."""
    from diffusers import WanImageToVideoPipeline

    clean_prompts_without_ftfy()
    return WanImageToVideoPipeline(**build_wan_ti2v(seed).components, expand_timesteps=True)


TINY = (TinyPipeline("wan", build_wan, dict(height=32, width=32, num_frames=5, num_inference_steps=2)),
        TinyPipeline("wan22", build_wan22, dict(height=32, width=32, num_frames=5, num_inference_steps=3)),
        TinyPipeline("wan_i2v", build_wan_i2v, dict(height=32, width=32, num_frames=5, num_inference_steps=2)),
        TinyPipeline("wan_flf2v", build_wan_flf2v, dict(height=32, width=32, num_frames=5, num_inference_steps=2)),
        TinyPipeline("wan22_i2v", build_wan22_i2v, dict(height=32, width=32, num_frames=5, num_inference_steps=3)),
        TinyPipeline("wan_ti2v", build_wan_ti2v, dict(height=32, width=32, num_frames=5, num_inference_steps=2)),
        TinyPipeline("wan_ti2v_i2v", build_wan_ti2v_i2v, dict(height=32, width=32, num_frames=5,
                                                              num_inference_steps=2)))
