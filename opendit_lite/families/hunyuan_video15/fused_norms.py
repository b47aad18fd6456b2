"""Fused AdaLN in diffusers' ``HunyuanVideo15Transformer3DModel``.

* ``HunyuanVideo15TransformerBlock`` (double stream, the model's only block kind): ``norm1`` /
  ``norm1_context`` are ``AdaLayerNormZero`` (``diffusers_norms``); each stream's attention residual and
  ``norm2`` / ``norm2_context`` with the feed-forward's modulation run as one gated-residual kernel
  (``diffusers_family_blocks.double_stream_forward``): the block's forward is HunyuanVideo 1.0's, whose
  fused block (``hunyuan_video/fused_norms.py``) serves both.
* ``norm_out``: ``AdaLayerNormContinuous`` (``diffusers_norms``).

Left: the token refiner's blocks (affine LayerNorms without modulation: ``fused_layernorm``'s kind,
and gates only), the ByT5 and image projections' LayerNorms (no modulation), and each block's last
residual (the next norm is in the next block).
"""

from ...converter.diffusers_family_blocks import DOUBLE_STREAM_NORMS, FusedBlock, FusedNorms
from ..hunyuan_video.fused_norms import FusedHunyuanVideoTransformerBlock  # the same block forward as 1.0's

MODULE = "diffusers.models.transformers.transformer_hunyuan_video15"


FUSED_NORMS = FusedNorms(
    blocks=(FusedBlock(MODULE, "HunyuanVideo15TransformerBlock", DOUBLE_STREAM_NORMS,
                       FusedHunyuanVideoTransformerBlock),),
    fused=("double blocks: AdaLayerNormZero of both streams, attention residual + norm2 + modulation of both "
           "streams (gated-residual kernel); norm_out: AdaLayerNormContinuous"),
    left=("token refiner blocks: affine LayerNorms without modulation (fused_layernorm's kind) and gates only",
          "ByT5 and image projections: LayerNorms without modulation",
          "each block's last residual: the next norm is in the next block"))
