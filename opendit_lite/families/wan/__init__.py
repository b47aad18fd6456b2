"""Wan 2.1 / 2.2 (diffusers' ``WanTransformer3DModel``): its record in the families registry, built from the
pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``) and its
capabilities, and registered on import."""

from ..lora_targets import ATTENTION
from ..registry import Family, register_family
from .adapter import WanAdapter
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .sp_spec import SP_SPEC

FAMILY = register_family(Family(
    name="wan",
    class_name="WanTransformer3DModel",
    pipeline="WanPipeline",
    module="diffusers.models.transformers.transformer_wan",
    block_lists=("blocks",),
    lora_targets=ATTENTION + ("ffn.net.0.proj", "ffn.net.2"),
    adapter=WanAdapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
))
