"""The tiny random pipeline of HunyuanVideo's released layout (``hunyuanvideo``), for tests and
``scripts/make_tiny_pipeline.py``."""

import torch

from ..tiny_parts import (
    TinyPipeline,
    clip_encoder,
    clip_tokenizer,
    diffusers_model,
    flow_scheduler,
    llama_encoder,
    llama_tokenizer,
    random_transformer,
)


def build_hunyuanvideo(seed: int = 0):
    """HunyuanVideo (``HunyuanVideoPipeline``): Llama (16 wide; its prompt template), CLIP-L's pooled
    output (16 wide), the guidance-distilled transformer, its VAE (scaling 0.476986), flow shift 7."""
    from diffusers import HunyuanVideoPipeline
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    tokenizer = llama_tokenizer(texts=[DEFAULT_PROMPT_TEMPLATE["template"].replace("{}", "")])
    tokenizer_2 = clip_tokenizer()
    transformer = random_transformer(
        "HunyuanVideoTransformer3DModel", seed, in_channels=4, out_channels=4, num_attention_heads=2,
        attention_head_dim=10, num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1,
        guidance_embeds=True, text_embed_dim=16, pooled_projection_dim=16, rope_axes_dim=(2, 4, 4))
    vae = diffusers_model("AutoencoderKLHunyuanVideo", seed + 1, block_out_channels=(8, 8, 8),
                          down_block_types=("HunyuanVideoDownBlock3D",) * 3,
                          up_block_types=("HunyuanVideoUpBlock3D",) * 3, latent_channels=4, layers_per_block=1,
                          norm_num_groups=2, spatial_compression_ratio=4, temporal_compression_ratio=4,
                          scaling_factor=0.476986)
    torch.manual_seed(seed + 2)
    return HunyuanVideoPipeline(
        tokenizer=tokenizer, text_encoder=llama_encoder(tokenizer, 16), tokenizer_2=tokenizer_2,
        text_encoder_2=clip_encoder(tokenizer_2, 16), transformer=transformer, vae=vae.eval(),
        scheduler=flow_scheduler(shift=7.0))


TINY = (TinyPipeline("hunyuanvideo", build_hunyuanvideo, dict(height=32, width=32, num_frames=5,
                                                               num_inference_steps=2)),)
