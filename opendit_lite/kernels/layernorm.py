"""LayerNorm with affine parameters on the Triton norm kernels, and the choice of a fused LayerNorm.

``TritonLayerNorm`` is an ``nn.LayerNorm`` (same constructor, parameters and state-dict keys) whose
forward runs the custom op ``opendit_lite::norm_affine_fwd`` (``custom_ops.py``) with ``a = weight`` and
``shift = bias`` over the input viewed as ``[1, rows, D]``; its backward gives dx and, from
deterministic fp32 partial sums, dweight and dbias. Numerics: fp32 statistics and arithmetic, output
rounded once to the input's dtype (as torch's LayerNorm does with fp32 weights and a bf16 input);
gradients in each tensor's dtype. On tensors the kernels cannot take (see ``triton_dispatch``) it
computes the same thing with torch.

``to_fused_layernorm`` picks the fastest implementation present for a converted module:
apex's ``FusedLayerNorm`` when apex imports, else ``TritonLayerNorm``, else the module unchanged.
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import custom_ops
from .kernel_choice import choose_kernel
from .triton_dispatch import triton_runs_on, triton_unavailable_reason


def layer_norm_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """The torch path: same function and numerics as the kernel (fp32 throughout, one rounding)."""
    D = x.size(-1)
    return F.layer_norm(x.float(), (D,), weight.float(), bias.float(), eps).to(x.dtype)


def triton_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last axis with affine ``weight``, ``bias`` [D]; x: [..., D] -> [..., D]."""
    D = x.size(-1)
    if weight.shape != (D,) or bias.shape != (D,):
        raise ValueError(
            f"triton_layer_norm: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} must both be "
            f"[D] = [{D}] for x of shape {tuple(x.shape)}"
        )
    args = (x, weight, bias, eps)
    if triton_runs_on(x):
        return choose_kernel("layer_norm", layer_norm_triton, layer_norm_torch, args)(*args)
    return layer_norm_torch(*args)


def layer_norm_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """The Triton path of ``triton_layer_norm`` (shapes already checked)."""
    D = x.size(-1)
    x3 = x.reshape(1, -1, D)                                           # [1, M, D]
    w3, b3 = weight.view(1, 1, D), bias.view(1, 1, D)                  # [1, 1, D]: broadcast to every row
    y, _, _ = custom_ops.norm_affine_fwd(x3, b3, w3, eps, False, x.dtype)  # [1, M, D]
    return y.view(x.shape)


class TritonLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the last axis, with weight and bias, running the Triton kernels."""

    def __init__(self, normalized_shape, eps: float = 1e-5, device=None, dtype=None):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=True, bias=True, device=device, dtype=dtype)
        if len(self.normalized_shape) != 1:
            raise ValueError(
                f"TritonLayerNorm normalises the last axis only; got normalized_shape={self.normalized_shape}"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return triton_layer_norm(x, self.weight, self.bias, self.eps)  # [..., D]


def _apex_fused_layernorm_cls():
    """apex's ``FusedLayerNorm`` class, or None when apex (with its CUDA extension) does not import."""
    try:
        from apex.normalization import FusedLayerNorm
    except (ImportError, OSError):
        return None
    return FusedLayerNorm


def fused_layernorm_provider() -> Tuple[str, str]:
    """``(provider, reason)``: "apex", "triton" or "torch", and why, for the conversion report."""
    if _apex_fused_layernorm_cls() is not None:
        return "apex", "apex.normalization.FusedLayerNorm"
    reason = triton_unavailable_reason()
    if reason is None:
        return "triton", "Triton LayerNorm (apex not installed)"
    return "torch", f"neither apex nor Triton: {reason}"


def is_convertible_layernorm(module: nn.LayerNorm) -> bool:
    """A LayerNorm over the last axis with both weight and bias: the case the fused kernels cover."""
    return len(module.normalized_shape) == 1 and module.weight is not None and module.bias is not None


def to_fused_layernorm(module: nn.LayerNorm, provider: Optional[str] = None) -> nn.Module:
    """A fused LayerNorm sharing ``module``'s parameters (same objects, so optimiser state, device
    and dtype carry over), or ``module`` itself when it is not convertible or no provider exists.

    provider: "apex", "triton" or "torch" (keep the module); default: ``fused_layernorm_provider()``.
    """
    provider = provider or fused_layernorm_provider()[0]
    if provider == "torch" or not is_convertible_layernorm(module):
        return module
    if provider == "apex":
        fused = _apex_fused_layernorm_cls()(module.normalized_shape, eps=module.eps, elementwise_affine=True)
    elif provider == "triton":
        fused = TritonLayerNorm(module.normalized_shape, eps=module.eps, device="meta")
    else:
        raise ValueError(f"unknown fused LayerNorm provider {provider!r}; expected 'apex', 'triton' or 'torch'")
    fused.weight, fused.bias = module.weight, module.bias
    return fused
