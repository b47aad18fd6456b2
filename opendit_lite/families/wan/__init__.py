"""Wan 2.1 / 2.2 (diffusers' ``WanTransformer3DModel``): its record in the families registry, built from the
pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``,
``conditioning.py``, ``tiny.py``, ``step_cache.py``, ``original_lora.py``), its capabilities and its released
checkpoints' shapes for the planner; registered on import."""

from ..lora_targets import ATTENTION
from ..registry import Family, Release, register_family
from .adapter import WanAdapter
from .conditioning import CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

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
    step_cache=STEP_CACHE,
    releases=(Release("Wan-AI/Wan2.1-T2V-14B-Diffusers", dict(
        patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024)),),
    conditioning=CONDITIONING,
    tiny=TINY,
    original_lora=ORIGINAL_LORA,
))
