"""Z-Image (diffusers' ``ZImageTransformer2DModel``, ``ZImagePipeline``; the base model and the few-step
Z-Image-Turbo): its record in the families registry, built from the pieces in this folder
(``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``, ``conditioning.py``, ``tiny.py``,
``step_cache.py``, ``original_lora.py``), its capabilities and its released checkpoints' shapes for
the planner; registered on import.

Block lists in forward order: the image tokens' ``noise_refiner``, the caption's ``context_refiner``,
then the joint ``layers``. LoRA adapts every attention's projections and the SwiGLU feed-forward
(``feed_forward.w1/w2/w3``) of every block.
"""

from ..lora_targets import ATTENTION
from ..registry import Family, Release, register_family
from .adapter import ZImageAdapter
from .conditioning import CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

# The released transformer/config.json (Z-Image and Z-Image-Turbo share the architecture: 6B parameters).
_RELEASED = dict(all_patch_size=[2], all_f_patch_size=[1], in_channels=16, dim=3840, n_layers=30, n_refiner_layers=2,
                 n_heads=30, n_kv_heads=30, norm_eps=1e-05, qk_norm=True, cap_feat_dim=2560, rope_theta=256.0,
                 t_scale=1000.0, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512])

FAMILY = register_family(Family(
    name="z_image",
    class_name="ZImageTransformer2DModel",
    pipeline="ZImagePipeline",
    module="diffusers.models.transformers.transformer_z_image",
    block_lists=("noise_refiner", "context_refiner", "layers"),
    lora_targets=ATTENTION + ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3"),
    adapter=ZImageAdapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    conditioning=CONDITIONING,
    tiny=TINY,
    aliases=("zimage",),
    original_lora=ORIGINAL_LORA,
    releases=(Release("Tongyi-MAI/Z-Image-Turbo", _RELEASED), Release("Tongyi-MAI/Z-Image", _RELEASED)),
))
