"""The built-in conversions, registered in the default registry when ``opendit_lite.converter`` is
imported:

=================  ====================  ==========================================  =======================
name               source type           replacement                                 switched on by (option)
=================  ====================  ==========================================  =======================
fused_adaln        LayerNormModulate     FusedLayerNormModulate (Triton)             ``fused_adaln``
fused_adaln        GatedResidualNorm     FusedGatedResidualNorm (Triton)             ``fused_adaln``
fused_layernorm    nn.LayerNorm          apex FusedLayerNorm, else TritonLayerNorm   ``fused_layernorm``
attention_backend  SDPAAttentionOp       FlashAttentionOp                            ``attention_backend``
=================  ====================  ==========================================  =======================

All use ``PRIORITY_BACKEND``. ``opendit_lite.kernels`` is imported inside the functions, at
conversion time, not here: this module is imported with ``opendit_lite`` itself, and importing the
kernels decorates them for compilation or, when ``TRITON_INTERPRET=1`` is set by then, for the
interpreter. Deferring the import lets a test session set the variable after ``opendit_lite`` is
imported, and keeps Triton and flash-attn out of programs that never build a converter.
"""

from typing import Optional, Tuple

import torch.nn as nn

from opendit_lite.models.layers.attention import SDPAAttentionOp
from opendit_lite.models.layers.modulate import GatedResidualNorm, LayerNormModulate

from .registry import CONVERSIONS, ConversionRegistry, ConverterOptions

# ----------------------------------------------------------------------------- fused AdaLN

def _fused_adaln_enabled(options: ConverterOptions) -> bool:
    return bool(options.fused_adaln)


def _fused_adaln_describe(options: ConverterOptions) -> Optional[str]:
    if not _fused_adaln_enabled(options):
        return None
    from opendit_lite.kernels import triton_unavailable_reason

    reason = triton_unavailable_reason()
    if reason is not None:
        return f"torch path ({reason})"
    return "Triton kernels on CUDA tensors, torch path on CPU tensors"


def _to_fused_adaln(module: LayerNormModulate, options: ConverterOptions, context: dict) -> nn.Module:
    from opendit_lite.kernels import FusedLayerNormModulate

    return FusedLayerNormModulate.from_module(module)


def _to_fused_residual(module: GatedResidualNorm, options: ConverterOptions, context: dict) -> nn.Module:
    from opendit_lite.kernels import FusedGatedResidualNorm

    return FusedGatedResidualNorm.from_module(module)


# ----------------------------------------------------------------------------- fused LayerNorm

def _fused_layernorm_enabled(options: ConverterOptions) -> bool:
    return bool(options.fused_layernorm)


def _fused_layernorm_describe(options: ConverterOptions) -> Optional[str]:
    if not _fused_layernorm_enabled(options):
        return None
    from opendit_lite.kernels import fused_layernorm_provider

    return fused_layernorm_provider()[1] + "; LayerNorms without weight and bias are kept"


def _to_fused_layernorm(module: nn.LayerNorm, options: ConverterOptions, context: dict) -> nn.Module:
    from opendit_lite.kernels import to_fused_layernorm

    return to_fused_layernorm(module)


# ----------------------------------------------------------------------------- attention backend

def _attention_backend(options: ConverterOptions) -> Tuple[str, str]:
    from opendit_lite.kernels import resolve_attention_backend

    return resolve_attention_backend(options.attention_backend)


def _attention_enabled(options: ConverterOptions) -> bool:
    return _attention_backend(options)[0] == "flash"


def _attention_describe(options: ConverterOptions) -> str:
    backend, reason = _attention_backend(options)
    return f"attention: {backend} ({reason})"


def _to_flash_attention(module: SDPAAttentionOp, options: ConverterOptions, context: dict) -> nn.Module:
    from opendit_lite.kernels import FlashAttentionOp

    return FlashAttentionOp()


def register_builtin_conversions(registry: ConversionRegistry) -> None:
    """Register the conversions above in ``registry`` (done once for ``CONVERSIONS``)."""
    registry.register(LayerNormModulate, _to_fused_adaln, name="fused_adaln",
                      enabled=_fused_adaln_enabled, describe=_fused_adaln_describe)
    registry.register(GatedResidualNorm, _to_fused_residual, name="fused_adaln",
                      enabled=_fused_adaln_enabled, describe=_fused_adaln_describe)
    registry.register(nn.LayerNorm, _to_fused_layernorm, name="fused_layernorm",
                      enabled=_fused_layernorm_enabled, describe=_fused_layernorm_describe)
    registry.register(SDPAAttentionOp, _to_flash_attention, name="attention_backend",
                      enabled=_attention_enabled, describe=_attention_describe)


register_builtin_conversions(CONVERSIONS)
