"""SD3 / SD3.5 (diffusers' ``SD3Transformer2DModel``): its record in the families registry, built from the pieces
in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``, ``conditioning.py``,
``tiny.py``, ``step_cache.py``) and its capabilities, and registered on import."""

from ..lora_targets import CONTEXT_FEED_FORWARD, FEED_FORWARD, JOINT_ATTENTION
from ..registry import Family, register_family
from .adapter import SD3Adapter
from .conditioning import CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

FAMILY = register_family(Family(
    name="sd3",
    class_name="SD3Transformer2DModel",
    pipeline="StableDiffusion3Pipeline",
    module="diffusers.models.transformers.transformer_sd3",
    block_lists=("transformer_blocks",),
    lora_targets=JOINT_ATTENTION + FEED_FORWARD + CONTEXT_FEED_FORWARD,
    adapter=SD3Adapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    conditioning=CONDITIONING,
    tiny=TINY,
    original_lora=ORIGINAL_LORA,
))
