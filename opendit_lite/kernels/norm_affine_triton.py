"""Triton kernels for a row LayerNorm followed by an affine map, shared by fused AdaLN and LayerNorm.

Both ops compute, for every row ``x`` of ``D`` features (statistics in fp32)::

    xhat = (x - mean(x)) * rstd,   rstd = 1 / sqrt(var(x) + eps)
    y    = xhat * a + shift

and differ only in where ``a`` and ``shift`` come from:

* fused AdaLN: ``a = 1 + scale`` with ``shift``/``scale`` per sample ``[B, 1, D]`` (broadcast over
  the sample's ``N`` tokens) or per token ``[B, N, D]``;
* LayerNorm with affine: ``a = weight``, ``shift = bias``, i.e. the per-sample case with the whole
  input viewed as one sample ``[1, M, D]``.

So one forward and one backward kernel serve both (``SCALE_PLUS_ONE`` selects ``1 + scale`` or
``scale``), and the modulation row of data row ``r`` is found from the row's sample
``b = r // N`` and token ``n = r % N``. OpenDiT's modulate kernel indexed it by the program's
block instead, which mixes up samples as soon as the batch has more than one.

Backward, with ``g = dy * a``::

    dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dshift = sum over the rows sharing a modulation row of dy
    dscale = sum over the same rows of dy * xhat

Per-token modulation owns one row each, so its gradients are stored per row. Per-sample modulation
is shared by ``N`` rows: each program walks a block of rows of one sample, accumulates fp32
partial sums in registers and writes them to a ``[B, J, D]`` buffer that torch reduces over ``J``
afterwards. Every launch therefore sums in the same order: the gradients are deterministic, which
float atomics would not be.

Layering (as in Liger-Kernel): ``@triton.jit`` kernels here -> host launch functions here ->
autograd Functions and modules in ``adaln.py`` / ``layernorm.py``.
"""

from typing import Tuple

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

# The whole row lives in registers (the backward holds five row vectors per program); beyond this
# width they spill and a two-pass kernel would be needed. Diffusion transformers use D <= 4096.
MAX_FUSED_DIM = 16384

# Backward of per-sample modulation: at least this many rows per program, so the fp32 partial
# sums (8 bytes per feature per program) stay small next to the rows a program reads.
MIN_ROWS_PER_PROGRAM = 8

# Backward programs to aim for per streaming multiprocessor: enough resident warps to keep memory
# busy while each program walks its rows one after the other.
PROGRAMS_PER_SM = 8


@triton.jit
def _norm_affine_fwd_kernel(
    X, Y, SHIFT, SCALE, MEAN, RSTD,
    N, D,
    stride_shift_b, stride_shift_n, stride_scale_b, stride_scale_n,
    eps,
    SCALE_PLUS_ONE: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per row of the contiguous [B * N, D] input.
    row = tl.program_id(0).to(tl.int64)
    b = row // N
    n = row % N
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D

    x = tl.load(X + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / D
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / D + eps)

    # A stride of 0 broadcasts: per-sample modulation has stride_n == 0, LayerNorm also stride_b == 0.
    shift = tl.load(SHIFT + b * stride_shift_b + n * stride_shift_n + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(SCALE + b * stride_scale_b + n * stride_scale_n + cols, mask=mask, other=0.0).to(tl.float32)
    if SCALE_PLUS_ONE:
        a = a + 1.0

    y = xc * rstd * a + shift
    tl.store(Y + row * D + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def _norm_affine_bwd_kernel(
    DY, X, SCALE, MEAN, RSTD, DX, DSHIFT, DSCALE,
    N, D, rows_per_program, programs_per_sample,
    stride_scale_b, stride_scale_n,
    SCALE_PLUS_ONE: tl.constexpr,
    PER_ROW: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Program p walks rows [n_start, n_end) of sample b; DSHIFT/DSCALE are [B * N, D] in the
    # modulation's dtype when PER_ROW, else fp32 partial sums [B * programs_per_sample, D].
    pid = tl.program_id(0).to(tl.int64)
    b = pid // programs_per_sample
    n_start = (pid % programs_per_sample) * rows_per_program
    n_end = tl.minimum(n_start + rows_per_program, N)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D

    dshift_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    dscale_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n in range(n_start, n_end):
        row = b * N + n
        x = tl.load(X + row * D + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * D + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        # Per-sample modulation reads the same row for every n (stride_scale_n == 0): a cache hit.
        a = tl.load(SCALE + b * stride_scale_b + n * stride_scale_n + cols, mask=mask, other=0.0).to(tl.float32)
        if SCALE_PLUS_ONE:
            a = a + 1.0

        g = dy * a
        mean_g = tl.sum(g, axis=0) / D
        mean_g_xhat = tl.sum(g * xhat, axis=0) / D
        dx = (g - mean_g - xhat * mean_g_xhat) * rstd
        tl.store(DX + row * D + cols, dx.to(DX.dtype.element_ty), mask=mask)

        if PER_ROW:
            tl.store(DSHIFT + row * D + cols, dy.to(DSHIFT.dtype.element_ty), mask=mask)
            tl.store(DSCALE + row * D + cols, (dy * xhat).to(DSCALE.dtype.element_ty), mask=mask)
        else:
            dshift_acc += dy
            dscale_acc += dy * xhat

    if not PER_ROW:
        tl.store(DSHIFT + pid * D + cols, dshift_acc, mask=mask)
        tl.store(DSCALE + pid * D + cols, dscale_acc, mask=mask)


# Kernels decorated while TRITON_INTERPRET=1 was set run in Triton's interpreter, which executes
# them on CPU tensors too (slowly); compiled kernels need CUDA tensors.
KERNELS_INTERPRETED = not isinstance(_norm_affine_fwd_kernel, JITFunction)


def runs_on(tensor: torch.Tensor) -> bool:
    """Whether these kernels can take ``tensor``: a CUDA tensor, or any tensor under the interpreter."""
    return tensor.is_cuda or KERNELS_INTERPRETED


def launch_settings(dim: int) -> Tuple[int, int]:
    """``(BLOCK_D, num_warps)`` for rows of ``dim`` features: one power-of-two block per row, and
    more warps for wider rows so each thread keeps a handful of elements in registers."""
    if dim > MAX_FUSED_DIM:
        raise ValueError(
            f"the fused norm kernels hold a row of D features in registers and support D <= "
            f"{MAX_FUSED_DIM}; got D={dim}. Leave this module unconverted (torch path)."
        )
    block = triton.next_power_of_2(dim)
    num_warps = 4
    if block >= 2048:
        num_warps = 8
    if block >= 8192:
        num_warps = 16
    return block, num_warps


def split_rows(batch: int, seq: int, device: torch.device) -> Tuple[int, int]:
    """``(programs_per_sample, rows_per_program)`` for the per-sample backward.

    Aims at ``PROGRAMS_PER_SM`` programs per streaming multiprocessor over the whole batch (8 in
    all under the interpreter), with at least ``MIN_ROWS_PER_PROGRAM`` rows each.
    """
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    programs = max(1, min(triton.cdiv(PROGRAMS_PER_SM * sms, batch), triton.cdiv(seq, MIN_ROWS_PER_PROGRAM)))
    rows = triton.cdiv(seq, programs)
    return triton.cdiv(seq, rows), rows  # recount so that no program is left without rows


def _mod_strides(mod: torch.Tensor) -> Tuple[int, int]:
    """Element strides of a [B|1, N|1, D] modulation tensor over samples and tokens; 0 broadcasts."""
    stride_b = mod.stride(0) if mod.size(0) > 1 else 0
    stride_n = mod.stride(1) if mod.size(1) > 1 else 0
    return stride_b, stride_n


def norm_affine_forward(
    x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float, scale_plus_one: bool,
    out_dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel.

    x: contiguous [B, N, D]; shift, scale: [B|1, N|1, D] with unit stride over D (any strides
    elsewhere, so chunks of a larger adaLN projection need no copy).
    Returns y [B, N, D] in ``out_dtype`` and fp32 mean, rstd [B * N] for the backward.
    """
    B, N, D = x.shape
    block, num_warps = launch_settings(D)
    y = torch.empty((B, N, D), dtype=out_dtype, device=x.device)
    mean = torch.empty(B * N, dtype=torch.float32, device=x.device)
    rstd = torch.empty(B * N, dtype=torch.float32, device=x.device)
    _norm_affine_fwd_kernel[(B * N,)](
        x, y, shift, scale, mean, rstd,
        N, D,
        *_mod_strides(shift), *_mod_strides(scale),
        eps,
        SCALE_PLUS_ONE=scale_plus_one, BLOCK_D=block, num_warps=num_warps,
    )
    return y, mean, rstd


def norm_affine_backward(
    dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
    scale_plus_one: bool, shift_dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernel.

    dy, x: contiguous [B, N, D]; scale as in the forward, [B, N|1, D]; mean, rstd from the forward.
    Returns dx [B, N, D] in x's dtype, dshift and dscale shaped [B, N|1, D] in ``shift_dtype`` and
    scale's dtype.
    """
    B, N, D = x.shape
    block, num_warps = launch_settings(D)
    per_row = scale.size(1) == N
    dx = torch.empty_like(x)
    if per_row:
        programs, rows = N, 1
        dshift = torch.empty((B, N, D), dtype=shift_dtype, device=x.device)
        dscale = torch.empty((B, N, D), dtype=scale.dtype, device=x.device)
    else:
        programs, rows = split_rows(B, N, x.device)
        dshift = torch.empty((B, programs, D), dtype=torch.float32, device=x.device)
        dscale = torch.empty((B, programs, D), dtype=torch.float32, device=x.device)
    _norm_affine_bwd_kernel[(B * programs,)](
        dy, x, scale, mean, rstd, dx, dshift, dscale,
        N, D, rows, programs,
        *_mod_strides(scale),
        SCALE_PLUS_ONE=scale_plus_one, PER_ROW=per_row, BLOCK_D=block, num_warps=num_warps,
    )
    if not per_row:
        # [B, J, D] fp32 partial sums -> [B, 1, D], rounded once to the parameter's dtype.
        dshift = dshift.sum(dim=1, keepdim=True).to(shift_dtype)
        dscale = dscale.sum(dim=1, keepdim=True).to(scale.dtype)
    return dx, dshift, dscale
