"""HunyuanVideo (diffusers' ``HunyuanVideoTransformer3DModel``): its record in the families registry, built from
the pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``,
``conditioning.py``, ``tiny.py``, ``step_cache.py``, ``original_lora.py``), its capabilities and its released
checkpoints' shapes for the planner; registered on import."""

from ..lora_targets import CONTEXT_FEED_FORWARD, FEED_FORWARD, JOINT_ATTENTION, SINGLE_STREAM_MLP
from ..registry import Family, Release, register_family
from .adapter import HunyuanVideoAdapter
from .conditioning import CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

FAMILY = register_family(Family(
    name="hunyuan_video",
    class_name="HunyuanVideoTransformer3DModel",
    pipeline="HunyuanVideoPipeline",
    module="diffusers.models.transformers.transformer_hunyuan_video",
    block_lists=("transformer_blocks", "single_transformer_blocks"),
    lora_targets=JOINT_ATTENTION + FEED_FORWARD + CONTEXT_FEED_FORWARD + SINGLE_STREAM_MLP,
    adapter=HunyuanVideoAdapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    conditioning=CONDITIONING,
    tiny=TINY,
    original_lora=ORIGINAL_LORA,
    aliases=("hunyuanvideo",),
    releases=(Release("hunyuanvideo-community/HunyuanVideo", dict(
        in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128, num_layers=20,
        num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1, qk_norm="rms_norm",
        guidance_embeds=True, text_embed_dim=4096, pooled_projection_dim=768, rope_theta=256.0,
        rope_axes_dim=[16, 56, 56])),),
))
