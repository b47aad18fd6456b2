"""Flux (FLUX.1) (diffusers' ``FluxTransformer2DModel``): its record in the families registry, built from the
pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``) and its
capabilities, and registered on import."""

from ..lora_targets import CONTEXT_FEED_FORWARD, FEED_FORWARD, JOINT_ATTENTION, SINGLE_STREAM_MLP
from ..registry import Family, register_family
from .adapter import FluxAdapter
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .sp_spec import SP_SPEC

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
))
