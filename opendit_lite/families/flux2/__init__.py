"""FLUX.2 [dev] (diffusers' ``Flux2Transformer2DModel``, text to image through ``Flux2Pipeline``): its
record in the families registry, built from the pieces in this folder (``adapter.py``, ``sp_spec.py``,
``fused_norms.py``, ``encoding.py``, ``conditioning.py``, ``tiny.py``, ``step_cache.py``,
``original_lora.py``), its capabilities and its released checkpoint's shape for the planner (32B
parameters); registered on import."""

from ..lora_targets import (
    CONTEXT_SWIGLU_FEED_FORWARD,
    JOINT_ATTENTION,
    PARALLEL_SINGLE_STREAM,
    SWIGLU_FEED_FORWARD,
)
from ..registry import Family, Release, register_family
from .adapter import Flux2Adapter
from .conditioning import CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

FAMILY = register_family(Family(
    name="flux2",
    class_name="Flux2Transformer2DModel",
    pipeline="Flux2Pipeline",
    module="diffusers.models.transformers.transformer_flux2",
    block_lists=("transformer_blocks", "single_transformer_blocks"),
    lora_targets=JOINT_ATTENTION + SWIGLU_FEED_FORWARD + CONTEXT_SWIGLU_FEED_FORWARD + PARALLEL_SINGLE_STREAM,
    adapter=Flux2Adapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    releases=(Release("black-forest-labs/FLUX.2-dev", dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
        num_attention_heads=48, joint_attention_dim=15360, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=[32, 32, 32, 32], rope_theta=2000, eps=1e-6, guidance_embeds=True)),),
    conditioning=CONDITIONING,
    tiny=TINY,
    original_lora=ORIGINAL_LORA,
))
