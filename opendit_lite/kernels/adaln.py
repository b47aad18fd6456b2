"""Fused AdaLN: ``LayerNorm(x) * (1 + scale) + shift`` in one pass over ``x``, forward and backward.

Unfused, DiT's norm-then-modulate reads and writes the activation three times (LayerNorm, the
multiply, the add) and autograd keeps the intermediates; the fused kernel reads ``x`` once and
writes ``y`` once, and keeps for the backward only ``x`` and two fp32 numbers per row (mean, rstd).

* ``x``: [B, N, D] in fp32, bf16 or fp16;
* ``shift``, ``scale``: per sample [B, D] (or [B, 1, D]), broadcast over the N tokens as in DiT,
  or per token [B, N, D] as in video models with per-frame modulation. They may be views with any
  strides (the chunks of the adaLN projection); only a non-contiguous feature axis is copied;
* the output has the dtype torch's type promotion gives ``x``, ``shift`` and ``scale`` (the dtype
  ``LayerNormModulate`` returns), computed in fp32 and rounded once; gradients come back in each
  input's own dtype;
* optionally the LayerNorm has its own affine ``weight``, ``bias`` [D] (CogVideoX's norms):
  ``(LayerNorm(x) * weight + bias) * (1 + scale) + shift`` is the same row map with the
  multiplier ``weight * (1 + scale)`` and the offset ``bias * (1 + scale) + shift``, folded on the
  small [B, 1|N, D] modulation tensors in fp32 (``fold_affine``) before the one pass over ``x``;
  autograd takes the gradients of the folded tensors back to weight, bias, shift and scale (each
  summed in fp32 and rounded once to its own dtype). The output dtype is the promotion of all five
  inputs with ``x``.

The kernels are the torch custom op ``opendit_lite::norm_affine_fwd`` (``custom_ops.py``), so
``torch.compile`` keeps them in its graph. Dispatch: the Triton kernels run on CUDA tensors, and on
any tensor when Triton's interpreter is on (``TRITON_INTERPRET=1`` set before this module is
imported). Otherwise (CPU tensors, or Triton not installed) the torch path below computes the same
function with the same numerics: fp32 statistics and arithmetic, one rounding at the end. On CUDA the
torch path compiled also serves the shapes where it measured faster (``kernel_choice.py``).
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import custom_ops
from .kernel_choice import choose_kernel
from .triton_dispatch import triton_runs_on


def _as_modulation(x: torch.Tensor, mod: torch.Tensor, name: str) -> torch.Tensor:
    """Check a shift/scale against x [B, N, D] and view it as [B, 1, D] or [B, N, D]."""
    B, N, D = x.shape
    if mod.dim() == 2:
        mod = mod.unsqueeze(1)
    if mod.dim() != 3 or mod.size(0) != B or mod.size(1) not in (1, N) or mod.size(2) != D:
        raise ValueError(
            f"fused_adaln: {name} has shape {tuple(mod.shape)}, but for x of shape {tuple(x.shape)} it "
            f"must be per sample [B, D] = [{B}, {D}] (or [{B}, 1, {D}]) or per token [B, N, D] = "
            f"[{B}, {N}, {D}]"
        )
    if mod.device != x.device:
        raise ValueError(f"fused_adaln: {name} is on {mod.device} but x is on {x.device}; move them together")
    return mod if mod.stride(-1) == 1 else mod.contiguous()


def _check_inputs(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> None:
    if x.dim() != 3:
        raise ValueError(f"fused_adaln expects x of shape [B, N, D], got {tuple(x.shape)}")
    if shift.shape != scale.shape:
        raise ValueError(
            f"fused_adaln: shift {tuple(shift.shape)} and scale {tuple(scale.shape)} must have the same shape"
        )
    for name, t in (("x", x), ("shift", shift), ("scale", scale)):
        if not t.is_floating_point():
            raise TypeError(f"fused_adaln: {name} must be a floating-point tensor, got {t.dtype}")


def _output_dtype(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.promote_types(shift.dtype, scale.dtype))


def fold_affine(shift: torch.Tensor, scale: torch.Tensor, weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(offset, multiplier) of ``(LayerNorm(x) * weight + bias) * (1 + scale) + shift`` written as
    ``LayerNorm(x) * multiplier + offset``: ``weight * (1 + scale)`` and ``bias * (1 + scale) + shift``.

    shift, scale: [B, 1|N, D]; weight, bias: [D] or None (None: 1 and 0). Both results are fp32
    [B, 1|N, D], so that low-precision weights lose nothing in the fold."""
    one_plus_scale = 1 + scale.float()                                      # [B, 1|N, D]
    multiplier = one_plus_scale * weight.float() if weight is not None else one_plus_scale
    offset = shift.float() + one_plus_scale * bias.float() if bias is not None else shift.float()
    return offset, multiplier


def _affine_output_dtype(dtype: torch.dtype, *modulation: Optional[torch.Tensor]) -> torch.dtype:
    """The dtype of the unfused ``(LayerNorm(x) * weight + bias) * (1 + scale) + shift`` for an ``x``
    of ``dtype``: its promotion with every modulation tensor given (None: absent)."""
    for t in modulation:
        dtype = torch.promote_types(dtype, t.dtype) if t is not None else dtype
    return dtype


def _check_affine(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], who: str) -> None:
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (x.size(-1),):
            raise ValueError(f"{who}: the LayerNorm's {name} has shape {tuple(t.shape)}; for x of shape "
                             f"{tuple(x.shape)} it must be [D] = [{x.size(-1)}]")


def adaln_torch(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The torch path: same function and numerics as the kernel (fp32 throughout, one rounding)."""
    D = x.size(-1)
    shift = _as_modulation(x, shift, "shift")                  # [B, 1|N, D]
    scale = _as_modulation(x, scale, "scale")                  # [B, 1|N, D]
    out_dtype = _affine_output_dtype(x.dtype, shift, scale, weight, bias)
    offset, multiplier = fold_affine(shift, scale, weight, bias)           # fp32 [B, 1|N, D]
    normed = F.layer_norm(x.float(), (D,), eps=eps)            # [B, N, D]
    return (normed * multiplier + offset).to(out_dtype)        # [B, N, D]


def fused_adaln(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6,
                weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``LayerNorm(x) * (1 + scale) + shift`` (fp32 statistics); with ``weight``/``bias`` [D], the
    LayerNorm's own affine map comes first: ``(LayerNorm(x) * weight + bias) * (1 + scale) + shift``.

    x: [B, N, D]; shift, scale: [B, D] / [B, 1, D] per sample or [B, N, D] per token.
    Returns [B, N, D]. Takes the Triton kernels when they can run on ``x`` (see the module
    docstring), the torch path otherwise.
    """
    _check_inputs(x, shift, scale)
    _check_affine(x, weight, bias, "fused_adaln")
    args = (x, shift, scale, eps, weight, bias)
    if triton_runs_on(x):
        return choose_kernel("fused_adaln", adaln_triton, adaln_torch, args)(*args)
    return adaln_torch(*args)


def adaln_triton(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                 weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The Triton path of ``fused_adaln`` (inputs already checked)."""
    shift3 = _as_modulation(x, shift, "shift")                # [B, 1|N, D]
    scale3 = _as_modulation(x, scale, "scale")                # [B, 1|N, D]
    if weight is None and bias is None:
        y, _, _ = custom_ops.norm_affine_fwd(x, shift3, scale3, eps, True, _output_dtype(x, shift, scale))
        return y                                               # [B, N, D]
    offset, multiplier = fold_affine(shift3, scale3, weight, bias)         # fp32 [B, 1|N, D] each
    y, _, _ = custom_ops.norm_affine_fwd(x, offset, multiplier, eps, False,
                                         _affine_output_dtype(x.dtype, shift, scale, weight, bias))
    return y                                                   # [B, N, D]


class FusedNormModule(nn.Module):
    """What the fused norm modules share: an affine-free LayerNorm over ``hidden_size`` features
    (no parameters, so swapping one in leaves the state dict unchanged) and ``from_module``, by
    which the module converter maps a model's norm module onto it."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps

    @classmethod
    def from_module(cls, module: nn.Module) -> "FusedNormModule":
        """The fused module for a module with the same ``hidden_size`` and ``eps``."""
        return cls(module.hidden_size, eps=module.eps)

    def _check_width(self, x: torch.Tensor) -> None:
        if x.size(-1) != self.hidden_size:
            raise ValueError(f"{type(self).__name__}({self.hidden_size}) got x with {x.size(-1)} features")

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"


class FusedLayerNormModulate(FusedNormModule):
    """Affine-free LayerNorm then modulate on the fused AdaLN kernel: a drop-in replacement of the
    models' ``LayerNormModulate`` (same constructor, attributes and empty state dict).

    x: [B, N, D]; shift, scale: [B, D] or [B, N, D]; returns [B, N, D].
    """

    def forward(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        self._check_width(x)
        return fused_adaln(x, shift, scale, self.eps)
