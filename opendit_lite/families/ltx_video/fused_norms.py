"""Fused AdaLN in diffusers' ``LTXVideoTransformer3DModel`` (LTX-Video): nothing matches.

``LTXVideoTransformerBlock`` normalises with ``RMSNorm`` (no mean subtraction, no affine) before its
``scale_shift_table`` modulation; the project's fused kernels are LayerNorm + modulate, whose output
differs, so no block is converted. The final ``norm_out`` is a LayerNorm + modulate, but written in
the model's own forward and run once per step. These notes make ``parallelize`` say so when
``fused_adaln`` is requested.
"""

from ...converter.diffusers_family_blocks import FusedNorms

FUSED_NORMS = FusedNorms(
    blocks=(),
    fused="",
    left=("LTXVideoTransformerBlock: RMSNorm (no mean subtraction) + scale_shift_table modulation; the fused "
          "kernels are LayerNorm + modulate, so none of its norms match",
          "norm_out: LayerNorm + modulate in the model's own forward, once per step"))
