"""Fused kernels and the attention backend, each a drop-in replacement of a model module.

* ``fused_adaln`` / ``FusedLayerNormModulate``: Triton LayerNorm + adaLN modulation (replaces
  ``LayerNormModulate``);
* ``triton_layer_norm`` / ``TritonLayerNorm``: Triton LayerNorm with affine (replaces
  ``nn.LayerNorm``; apex's ``FusedLayerNorm`` is preferred when installed, see
  ``to_fused_layernorm``);
* ``FlashAttentionOp``: flash-attn (replaces ``SDPAAttentionOp``).

The module converter (``opendit_lite.converter``) swaps them in from config keys. Importing this
package imports Triton and decorates the kernels; set ``TRITON_INTERPRET=1`` before that to run
them on CPU tensors.
"""

from .flash_attention import ATTENTION_BACKENDS, FlashAttentionOp, flash_attn_version, resolve_attention_backend
from .adaln import FusedAdaLNFunction, FusedLayerNormModulate, fused_adaln
from .layernorm import (
    TritonLayerNorm,
    TritonLayerNormFunction,
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
    "FusedAdaLNFunction",
    "FusedLayerNormModulate",
    "fused_adaln",
    "TritonLayerNorm",
    "TritonLayerNormFunction",
    "fused_layernorm_provider",
    "to_fused_layernorm",
    "triton_layer_norm",
    "triton_runs_on",
    "triton_unavailable_reason",
]
