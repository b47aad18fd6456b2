"""The Triton norm kernels as torch custom ops, so ``torch.compile(..., fullgraph=True)`` keeps them
in its graph (no graph break) and autograd, fake tensors and AOT tracing know their shapes.

Four ops in the ``opendit_lite`` namespace, each a forward or a backward launch of
``norm_affine_triton``; the forward ops carry an autograd registration whose backward calls the
matching backward op:

* ``norm_affine_fwd(x, shift, scale, eps, scale_plus_one, out_dtype) -> (y, mean, rstd)``: LayerNorm
  of x [B, N, D] then ``* a + shift`` with ``a = 1 + scale`` (AdaLN) or ``scale`` (LayerNorm);
  shift, scale: [B|1, N|1, D];
* ``norm_affine_bwd(dy, x, scale, mean, rstd, scale_plus_one, shift_dtype) -> (dx, dshift, dscale)``;
* ``gated_residual_norm_fwd(x, h, gate, shift, scale, eps, scale_plus_one, out_dtype)
  -> (x_new, y, mean, rstd)``: ``x_new = x + gate * h`` (in the promotion of the three dtypes) and
  LayerNorm of x_new then ``* a + shift`` (``a`` as above); gate, shift, scale: [B, 1|N, D];
* ``gated_residual_norm_bwd(dy, dx_new, x_new, h, gate, scale, mean, rstd, scale_plus_one, x_dtype,
  shift_dtype) -> (dx, dh, dgate, dshift, dscale)``.

mean and rstd (fp32, [B * N]) are outputs only so that the backward can use them; they carry no
gradient. The ops take any strides (they make what the kernels need contiguous) and return new
tensors. Callers (``adaln.py``, ``gated_residual.py``, ``layernorm.py``) check shapes and call
the ops only where the kernels run (``triton_dispatch.triton_runs_on``).
"""

from typing import Optional, Tuple

import torch
from torch import library as torch_ops

from .triton_dispatch import norm_affine_triton

Tensor = torch.Tensor


def _unit_stride(t: Tensor) -> Tensor:
    """The kernels need unit stride over D only; other strides (chunks of one projection) are kept."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _stats_like(x: Tensor) -> Tuple[Tensor, Tensor]:
    rows = x.shape[0] * x.shape[1]
    return (x.new_empty(rows, dtype=torch.float32), x.new_empty(rows, dtype=torch.float32))


# ----------------------------------------------------------------------------- LayerNorm + affine

@torch_ops.custom_op("opendit_lite::norm_affine_fwd", mutates_args=())
def norm_affine_fwd(x: Tensor, shift: Tensor, scale: Tensor, eps: float, scale_plus_one: bool,
                    out_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    return norm_affine_triton.norm_affine_forward(
        x.contiguous(), _unit_stride(shift), _unit_stride(scale), eps, scale_plus_one, out_dtype
    )


@norm_affine_fwd.register_fake
def _(x, shift, scale, eps, scale_plus_one, out_dtype):
    return (x.new_empty(x.shape, dtype=out_dtype), *_stats_like(x))


@torch_ops.custom_op("opendit_lite::norm_affine_bwd", mutates_args=())
def norm_affine_bwd(dy: Tensor, x: Tensor, scale: Tensor, mean: Tensor, rstd: Tensor, scale_plus_one: bool,
                    shift_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    return norm_affine_triton.norm_affine_backward(
        dy.contiguous(), x.contiguous(), _unit_stride(scale), mean, rstd, scale_plus_one, shift_dtype
    )


@norm_affine_bwd.register_fake
def _(dy, x, scale, mean, rstd, scale_plus_one, shift_dtype):
    mod_shape = (x.shape[0], scale.shape[1], x.shape[2])
    return (x.new_empty(x.shape), x.new_empty(mod_shape, dtype=shift_dtype), x.new_empty(mod_shape, dtype=scale.dtype))


def _norm_affine_setup(ctx, inputs, output):
    x, shift, scale, _, scale_plus_one, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, scale, mean, rstd)
    ctx.scale_plus_one, ctx.shift_dtype = scale_plus_one, shift.dtype
    ctx.shift_shape, ctx.scale_shape = shift.shape, scale.shape


def _norm_affine_backward(ctx, dy, _dmean, _drstd):
    x, scale, mean, rstd = ctx.saved_tensors
    dx, dshift, dscale = norm_affine_bwd(dy, x, scale, mean, rstd, ctx.scale_plus_one, ctx.shift_dtype)
    # dshift/dscale are [B|1, 1|N, D] sums; a broadcast [1, 1, D] (LayerNorm) has B = 1 already.
    return dx, dshift.reshape(ctx.shift_shape), dscale.reshape(ctx.scale_shape), None, None, None


norm_affine_fwd.register_autograd(_norm_affine_backward, setup_context=_norm_affine_setup)


# ----------------------------------------------------------------------------- gated residual + AdaLN

@torch_ops.custom_op("opendit_lite::gated_residual_norm_fwd", mutates_args=())
def gated_residual_norm_fwd(x: Tensor, h: Tensor, gate: Tensor, shift: Tensor, scale: Tensor,
                            eps: float, scale_plus_one: bool,
                            out_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    xn_dtype = torch.promote_types(x.dtype, torch.promote_types(h.dtype, gate.dtype))
    return norm_affine_triton.gated_residual_norm_forward(
        x.contiguous(), h.contiguous(), _unit_stride(gate), _unit_stride(shift), _unit_stride(scale), eps,
        scale_plus_one, xn_dtype, out_dtype,
    )


@gated_residual_norm_fwd.register_fake
def _(x, h, gate, shift, scale, eps, scale_plus_one, out_dtype):
    xn_dtype = torch.promote_types(x.dtype, torch.promote_types(h.dtype, gate.dtype))
    return (x.new_empty(x.shape, dtype=xn_dtype), x.new_empty(x.shape, dtype=out_dtype), *_stats_like(x))


@torch_ops.custom_op("opendit_lite::gated_residual_norm_bwd", mutates_args=())
def gated_residual_norm_bwd(dy: Tensor, dx_new: Optional[Tensor], x_new: Tensor, h: Tensor, gate: Tensor,
                            scale: Tensor, mean: Tensor, rstd: Tensor, scale_plus_one: bool, x_dtype: torch.dtype,
                            shift_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return norm_affine_triton.gated_residual_norm_backward(
        dy.contiguous(), None if dx_new is None else dx_new.contiguous(), x_new.contiguous(), h.contiguous(),
        _unit_stride(gate), _unit_stride(scale), mean, rstd, scale_plus_one, x_dtype, shift_dtype,
    )


@gated_residual_norm_bwd.register_fake
def _(dy, dx_new, x_new, h, gate, scale, mean, rstd, scale_plus_one, x_dtype, shift_dtype):
    mod_shape = (x_new.shape[0], scale.shape[1], x_new.shape[2])
    return (x_new.new_empty(x_new.shape, dtype=x_dtype), h.new_empty(h.shape),
            x_new.new_empty(mod_shape, dtype=gate.dtype), x_new.new_empty(mod_shape, dtype=shift_dtype),
            x_new.new_empty(mod_shape, dtype=scale.dtype))


def _gated_residual_setup(ctx, inputs, output):
    x, h, gate, shift, scale, _, scale_plus_one, _ = inputs
    x_new, _, mean, rstd = output
    ctx.save_for_backward(x_new, h, gate, scale, mean, rstd)
    ctx.scale_plus_one, ctx.x_dtype, ctx.shift_dtype = scale_plus_one, x.dtype, shift.dtype
    ctx.shapes = (gate.shape, shift.shape, scale.shape)


def _gated_residual_backward(ctx, dx_new, dy, _dmean, _drstd):
    x_new, h, gate, scale, mean, rstd = ctx.saved_tensors
    if dy is None:  # only x_new was used downstream: the norm contributes nothing
        dy = torch.zeros_like(x_new, dtype=torch.promote_types(x_new.dtype, scale.dtype))
    dx, dh, dgate, dshift, dscale = gated_residual_norm_bwd(
        dy, dx_new, x_new, h, gate, scale, mean, rstd, ctx.scale_plus_one, ctx.x_dtype, ctx.shift_dtype
    )
    gate_shape, shift_shape, scale_shape = ctx.shapes
    return (dx, dh, dgate.reshape(gate_shape), dshift.reshape(shift_shape), dscale.reshape(scale_shape),
            None, None, None)


gated_residual_norm_fwd.register_autograd(_gated_residual_backward, setup_context=_gated_residual_setup)
