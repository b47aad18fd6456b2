"""HunyuanVideo 1.5 (diffusers' ``HunyuanVideo15Transformer3DModel``; HunyuanVideo 1.0, another class,
is ``families/hunyuan_video/``): its record in the families registry, built from the pieces in this
folder (``adapter.py``, ``sp_spec.py``, ``fused_norms.py``, ``encoding.py``, ``conditioning.py``,
``tiny.py``, ``step_cache.py``; the image-to-video variant's ``conditioning_i2v.py``), its
capabilities and its released 8.3B transformer's shape for the planner; registered on import."""

from ..adapter_base import last_block_parameters
from ..lora_targets import ATTENTION, FEED_FORWARD
from ..registry import Family, PipelineVariant, Release, register_family
from .adapter import HunyuanVideo15Adapter
from .conditioning import CONDITIONING
from .conditioning_i2v import CONDITIONING as I2V_CONDITIONING
from .encoding import ENCODING
from .fused_norms import FUSED_NORMS
from .sp_spec import SP_SPEC
from .step_cache import STEP_CACHE
from .tiny import TINY

FAMILY = register_family(Family(
    name="hunyuan_video15",
    class_name="HunyuanVideo15Transformer3DModel",
    pipeline="HunyuanVideo15Pipeline",
    module="diffusers.models.transformers.transformer_hunyuan_video15",
    block_lists=("transformer_blocks",),
    # the attention projections and the video stream's feed-forward, not the text stream's output
    # projection and feed-forward: the last block's are in no step's graph (adapters there would get
    # no gradient, which DDP refuses)
    lora_targets=ATTENTION + ("add_q_proj", "add_k_proj", "add_v_proj") + FEED_FORWARD,
    adapter=HunyuanVideo15Adapter(),
    sp_spec=SP_SPEC,
    fused_norms=FUSED_NORMS,
    encoding=ENCODING,
    step_cache=STEP_CACHE,
    conditioning=CONDITIONING,
    tiny=TINY,
    variants=(PipelineVariant("HunyuanVideo15ImageToVideoPipeline", I2V_CONDITIONING),),
    aliases=("hunyuanvideo15", "hunyuanvideo1.5"),
    releases=(Release("hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v", dict(
        in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128, num_layers=54,
        num_refiner_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm", text_embed_dim=3584,
        text_embed_2_dim=1472, image_embed_dim=1152, rope_theta=256.0, rope_axes_dim=[16, 56, 56], target_size=640,
        task_type="t2v", use_meanflow=False)),),
    # the last block's text output projection and feed-forward: its text stream is dropped after it
    unused_parameters=last_block_parameters("transformer_blocks", ("attn.to_add_out.", "ff_context.")),
))
