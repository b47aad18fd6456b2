"""Wan 2.1 / 2.2 (diffusers' ``WanTransformer3DModel``): its record in the families registry, built from the
pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``,
``conditioning.py``, ``tiny.py``, ``step_cache.py``, ``original_lora.py``), its image-to-video pipeline
(``WanImageToVideoPipeline``: ``conditioning_i2v.py``), its capabilities and its released checkpoints'
shapes for the planner; registered on import."""

from ..lora_targets import ATTENTION
from ..registry import Family, PipelineVariant, Release, register_family
from .adapter import WanAdapter
from .conditioning import CONDITIONING
from .conditioning_i2v import CONDITIONING as I2V_CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

# The 14B transformers' shared numbers (Wan 2.1 and 2.2 A14B, text- and image-to-video).
_WAN_14B = dict(patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128, out_channels=16, text_dim=4096,
                freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                eps=1e-6, rope_max_seq_len=1024)

FAMILY = register_family(Family(
    name="wan",
    class_name="WanTransformer3DModel",
    pipeline="WanPipeline",
    module="diffusers.models.transformers.transformer_wan",
    block_lists=("blocks",),
    # add_k_proj / add_v_proj: Wan 2.1 I2V's image cross-attention (its CLIP states' keys and values; no such
    # layers elsewhere). Adapted with the rest, so that its LoRA file holds them, as load_lora_weights expects
    # of an image-to-video LoRA (else diffusers adds zero adapters there and peft warns of the mismatch).
    lora_targets=ATTENTION + ("add_k_proj", "add_v_proj", "ffn.net.0.proj", "ffn.net.2"),
    adapter=WanAdapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    releases=(
        Release("Wan-AI/Wan2.1-T2V-14B-Diffusers", dict(_WAN_14B, in_channels=16, image_dim=None,
                                                        added_kv_proj_dim=None)),
        # image-to-video: 16 noisy + 4 mask + 16 condition channels; Wan 2.1 adds CLIP image states
        Release("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", dict(_WAN_14B, in_channels=36, image_dim=1280,
                                                             added_kv_proj_dim=5120)),
        Release("Wan-AI/Wan2.2-I2V-A14B-Diffusers", dict(_WAN_14B, in_channels=36, image_dim=None,
                                                         added_kv_proj_dim=None), experts=2),  # two of it
        Release("Wan-AI/Wan2.2-TI2V-5B-Diffusers", dict(
            patch_size=[1, 2, 2], num_attention_heads=24, attention_head_dim=128, in_channels=48, out_channels=48,
            text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=30, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024)),
    ),
    conditioning=CONDITIONING,
    tiny=TINY,
    variants=(PipelineVariant("WanImageToVideoPipeline", I2V_CONDITIONING),),
    original_lora=ORIGINAL_LORA,
))
