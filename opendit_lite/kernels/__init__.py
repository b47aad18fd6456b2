"""Fused kernels and the attention backend, each a drop-in replacement of a model module.

* ``fused_adaln`` / ``FusedLayerNormModulate``: Triton LayerNorm + adaLN modulation (replaces
  ``LayerNormModulate``);
* ``gated_residual_adaln`` / ``FusedGatedResidualNorm``: adaLN-Zero's gated residual fused with the
  next LayerNorm + modulation (replaces ``GatedResidualNorm``);
* ``triton_layer_norm`` / ``TritonLayerNorm``: Triton LayerNorm with affine (replaces
  ``nn.LayerNorm``; apex's ``FusedLayerNorm`` is preferred when installed, see
  ``to_fused_layernorm``);
* ``FlashAttentionOp``: flash-attn (replaces ``SDPAAttentionOp``).

The norm kernels are torch custom ops (``ops.py``, namespace ``opendit_lite``) so that
``torch.compile(fullgraph=True)`` traces through them. The module converter (``opendit_lite.converter``) swaps them in from config keys. Importing this
package imports Triton and decorates the kernels; set ``TRITON_INTERPRET=1`` before that to run
them on CPU tensors.
"""

from .flash_attention import ATTENTION_BACKENDS, FlashAttentionOp, flash_attn_version, resolve_attention_backend
from .adaln import FusedLayerNormModulate, fused_adaln
from .gated_residual import FusedGatedResidualNorm, gated_residual_adaln
from .layernorm import (
    TritonLayerNorm,
    fused_layernorm_provider,
    to_fused_layernorm,
    triton_layer_norm,
)
from .triton_dispatch import triton_runs_on, triton_unavailable_reason

__all__ = [
    "ATTENTION_BACKENDS",
    "FlashAttentionOp",
    "flash_attn_version",
    "resolve_attention_backend",
    "FusedLayerNormModulate",
    "fused_adaln",
    "FusedGatedResidualNorm",
    "gated_residual_adaln",
    "TritonLayerNorm",
    "fused_layernorm_provider",
    "to_fused_layernorm",
    "triton_layer_norm",
    "triton_runs_on",
    "triton_unavailable_reason",
]
