"""LTX-Video (diffusers' ``LTXVideoTransformer3DModel``): its record in the families registry, built from the
pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``,
``conditioning.py``, ``tiny.py``, ``step_cache.py``, ``original_lora.py``) and its capabilities, and registered
on import."""

from ..lora_targets import ATTENTION, FEED_FORWARD
from ..registry import Family, register_family
from .adapter import LTXVideoAdapter
from .conditioning import CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

FAMILY = register_family(Family(
    name="ltx_video",
    class_name="LTXVideoTransformer3DModel",
    pipeline="LTXPipeline",
    module="diffusers.models.transformers.transformer_ltx",
    block_lists=("transformer_blocks",),
    lora_targets=ATTENTION + FEED_FORWARD,
    adapter=LTXVideoAdapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    conditioning=CONDITIONING,
    tiny=TINY,
    original_lora=ORIGINAL_LORA,
    aliases=("ltx",),
))
