"""Qwen-Image (diffusers' ``QwenImageTransformer2DModel``): its record in the families registry, built
from the pieces in this folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``,
``conditioning.py``, ``tiny.py``, ``step_cache.py``; the edit pipelines' ``conditioning_edit.py``), its
capabilities and its released checkpoint's shape for the planner; registered on import."""

from ..adapter_base import last_block_parameters
from ..lora_targets import ATTENTION
from ..registry import Family, PipelineVariant, Release, register_family
from .adapter import QwenImageAdapter
from .conditioning import CONDITIONING
from .conditioning_edit import EDIT, EDIT_PLUS
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .original_lora import ORIGINAL_LORA
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

# The attention projections the image tokens read (the image stream's q, k, v and output, the text's k and
# v) and the image stream's feed-forward. The text stream's own outputs (add_q_proj, to_add_out, txt_mlp)
# reach the image only through the next block, and from the last block not at all: adapters there would
# get no gradient, which DDP and ZeRO's bucketed reductions refuse.
LORA_TARGETS = ATTENTION + ("add_k_proj", "add_v_proj", "img_mlp.net.0.proj", "img_mlp.net.2")

# The 20B transformer of Qwen-Image and of its edit models (Edit, Edit-2509: the same architecture).
RELEASED = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=[16, 56, 56])


FAMILY = register_family(Family(
    name="qwen_image",
    class_name="QwenImageTransformer2DModel",
    pipeline="QwenImagePipeline",
    module="diffusers.models.transformers.transformer_qwenimage",
    block_lists=("transformer_blocks",),
    original_lora=ORIGINAL_LORA,
    lora_targets=LORA_TARGETS,
    adapter=QwenImageAdapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    aliases=("qwenimage",),
    releases=tuple(Release(repo, dict(RELEASED), pipeline) for repo, pipeline in (
        ("Qwen/Qwen-Image", ""), ("Qwen/Qwen-Image-Edit", "QwenImageEditPipeline"),
        ("Qwen/Qwen-Image-Edit-2509", "QwenImageEditPlusPipeline"))),
    conditioning=CONDITIONING,
    # the last block's text outputs (its attention's text output, text feed-forward): no later block reads them
    unused_parameters=last_block_parameters("transformer_blocks", ("attn.to_add_out.", "txt_mlp.")),
    variants=(PipelineVariant("QwenImageEditPipeline", EDIT), PipelineVariant("QwenImageEditPlusPipeline", EDIT_PLUS)),
    tiny=TINY,
))
