"""Fused adaLN-Zero residual: ``x_new = x + gate * h`` and the next ``LayerNorm(x_new) * (1 + scale)
+ shift`` in one pass, forward and backward.

Unfused, the gated residual and the norm after it read and write the residual stream five times
(the multiply, the add, the LayerNorm, the modulation's multiply and add); the kernel reads x, h
and the modulation once and writes x_new and the modulated output once, keeping for the backward
x_new, h and two fp32 numbers per row. The backward returns dx, dh and the per-sample (or
per-token) dgate, dshift, dscale, the per-sample ones from deterministic fp32 partial sums.

* x, h: [B, N, D] in fp32, bf16 or fp16; gate, shift, scale: [B, D] / [B, 1, D] per sample or
  [B, N, D] per token, all three with the same layout (views with any strides);
* x_new has the dtype torch's promotion gives x, h and gate (what ``x + gate * h`` returns); the
  modulated output the promotion of that with shift and scale. ``x_new`` is rounded to its dtype
  before it is normalised, exactly as the unfused module normalises the stored residual.

With the LayerNorm's own ``weight``/``bias`` [D] (CogVideoX), the modulation is folded as in
``fused_adaln`` (``adaln.fold_affine``) and the kernel multiplies by the folded multiplier.

Dispatch as ``fused_adaln``: the custom op ``opendit_lite::gated_residual_norm_fwd`` where the
Triton kernels run, a torch path with the same numerics elsewhere.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import custom_ops
from .adaln import FusedNormModule, _affine_output_dtype, _as_modulation, _check_affine, _check_inputs, fold_affine
from .kernel_choice import choose_kernel
from .triton_dispatch import triton_runs_on


def _check_residual(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor) -> None:
    if h.shape != x.shape:
        raise ValueError(f"gated_residual_adaln: h has shape {tuple(h.shape)}, x {tuple(x.shape)}; they must match")
    if gate.shape != shift.shape:
        raise ValueError(
            f"gated_residual_adaln: gate {tuple(gate.shape)} and shift {tuple(shift.shape)} must have the same "
            f"shape (both per sample or both per token)"
        )
    for name, t in (("h", h), ("gate", gate)):
        if not t.is_floating_point():
            raise TypeError(f"gated_residual_adaln: {name} must be a floating-point tensor, got {t.dtype}")


def _residual_dtype(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor) -> torch.dtype:
    """The dtype of ``x + gate * h``: torch's promotion of the three."""
    return torch.promote_types(x.dtype, torch.promote_types(h.dtype, gate.dtype))


def gated_residual_adaln_torch(x, h, gate, shift, scale, eps, weight=None, bias=None
                               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The torch path: fp32 arithmetic, x_new rounded once, then normalised in fp32 and rounded once."""
    xn_dtype = _residual_dtype(x, h, gate)
    out_dtype = _affine_output_dtype(xn_dtype, shift, scale, weight, bias)
    gate = _as_modulation(x, gate, "gate").float()                     # [B, 1|N, D]
    offset, multiplier = fold_affine(_as_modulation(x, shift, "shift"), _as_modulation(x, scale, "scale"),
                                     weight, bias)                     # fp32 [B, 1|N, D] each
    x_new = (x.float() + gate * h.float()).to(xn_dtype)                # [B, N, D]
    normed = F.layer_norm(x_new.float(), (x.size(-1),), eps=eps)       # [B, N, D]
    return x_new, (normed * multiplier + offset).to(out_dtype)         # 2 x [B, N, D]


def gated_residual_adaln(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor,
                         scale: torch.Tensor, eps: float = 1e-6, weight: Optional[torch.Tensor] = None,
                         bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``x_new = x + gate * h`` and ``LayerNorm(x_new) * (1 + scale) + shift``; with ``weight``/``bias``
    [D] the LayerNorm's affine map comes first, as in ``fused_adaln``.

    x, h: [B, N, D]; gate, shift, scale: [B, D] / [B, 1, D] or [B, N, D]. Returns (x_new, y), both
    [B, N, D]. Takes the Triton kernels when they can run on ``x``, the torch path otherwise.
    """
    _check_inputs(x, shift, scale)
    _check_residual(x, h, gate, shift)
    _check_affine(x, weight, bias, "gated_residual_adaln")
    args = (x, h, gate, shift, scale, eps, weight, bias)
    if triton_runs_on(x):
        serve = choose_kernel("gated_residual_adaln", gated_residual_adaln_triton, gated_residual_adaln_torch, args)
        return serve(*args)
    return gated_residual_adaln_torch(*args)


def gated_residual_adaln_triton(x, h, gate, shift, scale, eps, weight=None, bias=None
                                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The Triton path of ``gated_residual_adaln`` (inputs already checked)."""
    gate3 = _as_modulation(x, gate, "gate")                            # [B, 1|N, D]
    shift3 = _as_modulation(x, shift, "shift")                         # [B, 1|N, D]
    scale3 = _as_modulation(x, scale, "scale")                         # [B, 1|N, D]
    xn_dtype = _residual_dtype(x, h, gate)
    out_dtype = _affine_output_dtype(xn_dtype, shift, scale, weight, bias)
    if weight is None and bias is None:
        x_new, y, _, _ = custom_ops.gated_residual_norm_fwd(x, h, gate3, shift3, scale3, eps, True, out_dtype)
    else:
        offset, multiplier = fold_affine(shift3, scale3, weight, bias)  # fp32 [B, 1|N, D] each
        x_new, y, _, _ = custom_ops.gated_residual_norm_fwd(x, h, gate3, offset, multiplier, eps, False, out_dtype)
    return x_new, y                                                    # 2 x [B, N, D]


class FusedGatedResidualNorm(FusedNormModule):
    """adaLN-Zero's gated residual and the next LayerNorm + modulate on the fused kernel: a drop-in
    replacement of the models' ``GatedResidualNorm`` (same constructor, attributes and empty state
    dict). Returns (x_new, y), both [B, N, D]."""

    def forward(self, x, h, gate, shift, scale):
        self._check_width(x)
        return gated_residual_adaln(x, h, gate, shift, scale, self.eps)
