"""Flux (FLUX.1) (diffusers' ``FluxTransformer2DModel``): its record in the families registry, built from the
pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``,
``conditioning.py``, ``tiny.py``, ``step_cache.py``, ``original_lora.py``), its capabilities and its released
checkpoints' shapes for the planner; registered on import. FLUX.1 Kontext (``FluxKontextPipeline``, the same
transformer with a reference image) is a variant with its own conditioning (``conditioning_kontext.py``)."""

from ..lora_targets import CONTEXT_FEED_FORWARD, FEED_FORWARD, JOINT_ATTENTION, SINGLE_STREAM_MLP
from ..registry import Family, PipelineVariant, Release, register_family
from .adapter import FluxAdapter
from .conditioning import CONDITIONING
from .conditioning_kontext import CONDITIONING as KONTEXT
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

# FLUX.1-dev's transformer; FLUX.1 Kontext dev's is the same architecture (its transformer/config.json).
DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
           num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
           axes_dims_rope=[16, 56, 56])

FAMILY = register_family(Family(
    name="flux",
    class_name="FluxTransformer2DModel",
    pipeline="FluxPipeline",
    module="diffusers.models.transformers.transformer_flux",
    block_lists=("transformer_blocks", "single_transformer_blocks"),
    lora_targets=JOINT_ATTENTION + FEED_FORWARD + CONTEXT_FEED_FORWARD + SINGLE_STREAM_MLP,
    adapter=FluxAdapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    releases=(Release("black-forest-labs/FLUX.1-dev", DEV),
              Release("black-forest-labs/FLUX.1-Kontext-dev", DEV, "FluxKontextPipeline")),
    conditioning=CONDITIONING,
    variants=(PipelineVariant("FluxKontextPipeline", KONTEXT),),
    tiny=TINY,
    original_lora=ORIGINAL_LORA,
))
