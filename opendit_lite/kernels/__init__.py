"""Fused kernels and the attention backends, each behind a small interface of its own; the module
converter (``opendit_lite.converter``) maps the models' modules onto them.

* ``AttentionOp`` / ``SDPAAttentionOp`` (``attention_op.py``): the attention op interface the models
  call their attention core through, and torch's SDPA behind it;
* ``FlashAttentionOp``: flash-attn (replaces ``SDPAAttentionOp``);
* ``fused_adaln`` / ``FusedLayerNormModulate``: Triton LayerNorm + adaLN modulation (replaces the
  models' ``LayerNormModulate``);
* ``gated_residual_adaln`` / ``FusedGatedResidualNorm``: adaLN-Zero's gated residual fused with the
  next LayerNorm + modulation (replaces ``GatedResidualNorm``);
* ``triton_layer_norm`` / ``TritonLayerNorm``: Triton LayerNorm with affine (replaces
  ``nn.LayerNorm``; apex's ``FusedLayerNorm`` is preferred when installed, see
  ``to_fused_layernorm``).

On CUDA the norm wrappers time each kernel once per call signature against ``torch.compile`` of its
torch path and keep the faster (``kernel_choice.py``), so a fused kernel is never slower than compile.

The norm kernels are torch custom ops (``custom_ops.py``, namespace ``opendit_lite``) so that
``torch.compile(fullgraph=True)`` traces through them. The names below load on first use: the
models import ``attention_op.py`` (torch only), while the first use of a norm kernel imports Triton and
decorates the kernels; set ``TRITON_INTERPRET=1`` before that to run them on CPU tensors.
"""

from ..utils.lazy_exports import lazy_exports

# name -> the submodule defining it
_LAZY = {
    "AttentionOp": "attention",
    "SDPAAttentionOp": "attention",
    "ATTENTION_BACKENDS": "flash_attention",
    "FlashAttentionOp": "flash_attention",
    "flash_attn_version": "flash_attention",
    "resolve_attention_backend": "flash_attention",
    "FusedLayerNormModulate": "adaln",
    "fused_adaln": "adaln",
    "FusedGatedResidualNorm": "gated_residual",
    "gated_residual_adaln": "gated_residual",
    "TritonLayerNorm": "layernorm",
    "fused_layernorm_provider": "layernorm",
    "to_fused_layernorm": "layernorm",
    "triton_layer_norm": "layernorm",
    "triton_runs_on": "triton_dispatch",
    "triton_unavailable_reason": "triton_dispatch",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = list(_LAZY)
