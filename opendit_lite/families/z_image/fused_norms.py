"""Fused AdaLN in diffusers' ``ZImageTransformer2DModel`` (Z-Image): nothing matches.

``ZImageTransformerBlock`` normalises with ``RMSNorm`` (no mean subtraction, an affine weight) and
modulates by a scale alone (``attention_norm1(x) * (1 + scale)``); its gated residuals add a second
``RMSNorm`` of the attention and feed-forward outputs (``x + tanh(gate) * attention_norm2(attn)``).
The project's fused kernels are LayerNorm + shift/scale and a gated residual of the raw output into
the next LayerNorm, whose results differ, so no block is converted. The final layer's LayerNorm x
scale is written in ``FinalLayer.forward`` and runs once per step. These notes make ``parallelize``
say so when ``fused_adaln`` is requested.
"""

from ...converter.diffusers_family_blocks import FusedNorms

FUSED_NORMS = FusedNorms(
    blocks=(),
    fused="",
    left=("ZImageTransformerBlock: RMSNorm (no mean subtraction) x (1 + scale), and a second RMSNorm of each "
          "branch's output inside its tanh-gated residual; the fused kernels are LayerNorm + shift/scale and a "
          "gated residual of the raw branch output, so none of its norms match",
          "all_final_layer: LayerNorm x (1 + scale) in FinalLayer's own forward, once per step"))
