"""CogVideoX 1.0 / 1.5 (diffusers' ``CogVideoXTransformer3DModel``): its record in the families registry, built
from the pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``,
``conditioning.py``, ``tiny.py``, ``step_cache.py``) and its capabilities, and registered on import."""

from ..lora_targets import ATTENTION, FEED_FORWARD
from ..registry import Family, register_family
from .adapter import CogVideoXAdapter
from .conditioning import CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

FAMILY = register_family(Family(
    name="cogvideox",
    class_name="CogVideoXTransformer3DModel",
    pipeline="CogVideoXPipeline",
    module="diffusers.models.transformers.cogvideox_transformer_3d",
    block_lists=("transformer_blocks",),
    lora_targets=ATTENTION + FEED_FORWARD,
    adapter=CogVideoXAdapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    conditioning=CONDITIONING,
    tiny=TINY,
    # No original layout that a LoRA tool reads: THUDM's SAT checkpoint has no LoRA loader in diffusers
    # (neither a LoRA nor a single-file converter) and CogVideoX LoRAs circulate in the diffusers format.
    original_lora=None,
))
