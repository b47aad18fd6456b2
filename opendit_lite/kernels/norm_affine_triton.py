"""Triton kernels for a row LayerNorm followed by an affine map, optionally preceded by a gated
residual; shared by fused AdaLN, the fused adaLN-Zero residual and LayerNorm.

Every row ``x`` of ``D`` features (statistics in fp32) becomes::

    xhat = (x - mean(x)) * rstd,   rstd = 1 / sqrt(var(x) + eps)
    y    = xhat * a + shift

and the ops differ only in where ``a``, ``shift`` and ``x`` come from:

* fused AdaLN: ``a = 1 + scale`` with ``shift``/``scale`` per sample ``[B, 1, D]`` (broadcast over
  the sample's ``N`` tokens) or per token ``[B, N, D]``;
* LayerNorm with affine: ``a = weight``, ``shift = bias``, i.e. the per-sample case with the whole
  input viewed as one sample ``[1, M, D]``;
* the gated residual of adaLN-Zero fused with the next norm (``RESIDUAL``): the kernel reads the
  residual ``r``, the branch output ``h`` and the gate ``g`` and normalises ``x = r + g * h``,
  which it also writes (rounded to its storage dtype, and that rounded value is what is
  normalised, exactly as the unfused ``x = x + g * h; norm(x)`` does).

``SCALE_PLUS_ONE`` selects ``1 + scale`` or ``scale``; the modulation row of data row ``r`` is
found from the row's sample ``b = r // N`` and token ``n = r % N`` (a stride of 0 broadcasts).

Two tilings, chosen by the row width (``uses_row_kernels``):

* one pass, the row in registers (``_row_fwd_kernel`` / ``_row_bwd_kernel``), whenever the power
  of two covering ``D`` fits (``ROW_MAX_FWD`` / ``ROW_MAX_BWD`` features, 8192 / 4096): a program
  loads a ``[BLOCK_M, BLOCK_D]`` tile of rows once, takes the statistics in registers and writes
  its outputs once. Memory traffic is the minimum: per element, forward reads x and writes y
  (4 bytes in bf16; RESIDUAL: reads x, h, writes x_new, y: 8), backward reads x, dy and writes dx
  (6; RESIDUAL: also h, dx_new read and dh written: 12), plus 8 bytes of statistics per row.
  DiT-XL's D = 1152 pads to 2048 lanes; the idle lanes cost registers, not bandwidth (their loads
  and stores are masked off);
* column chunks for wider rows (``_norm_affine_fwd_kernel`` / ``_norm_affine_bwd_kernel``): a
  program holds ``BLOCK_M`` rows by ``BLOCK_C`` columns and walks the ``NUM_CHUNKS`` chunks of
  its rows, once per statistic (the re-reads of a row block mostly hit the cache). ``BLOCK_C`` is
  the power of two that covers ``D`` with the fewest idle lanes (``column_block``).

Backward, with ``g = dy * a``::

    dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))      (+ the incoming grad of x, RESIDUAL)
    dshift = sum over the rows sharing a modulation row of dy
    dscale = sum over the same rows of dy * xhat
    RESIDUAL: dr = dx, dh = dx * gate, dgate = sum of dx * h over the same rows

Per-token modulation owns one row each, so its gradients are stored per row. Per-sample modulation
is shared by ``N`` rows: each program walks a range of rows of one sample and sums its fp32 column
sums (in registers in the one-pass kernel; into its own row of the buffer in the chunked one) into
its own row of a ``[B, J, D]`` buffer that torch reduces over ``J`` afterwards. Every launch sums
in the same order, so the gradients are deterministic, which float atomics would not be.

Layering (as in Liger-Kernel): ``@triton.jit`` kernels here -> host launch functions here ->
torch custom ops with fake and autograd registrations in ``custom_ops.py`` -> functions and modules in
``adaln.py``, ``gated_residual.py`` and ``layernorm.py``.
"""

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

# Widest column chunk: beyond it a row is walked in several chunks anyway.
MAX_BLOCK_C = 2048

# Narrowest column chunk considered, and the idle-lane fraction accepted before a narrower chunk
# (more loop iterations) is preferred.
MIN_BLOCK_C = 16
MAX_IDLE_FRACTION = 1 / 16

# Elements per program tile (BLOCK_M x BLOCK_C): rows are added until the tile holds this many.
TILE_ELEMENTS = 2048
MAX_BLOCK_M = 64

# Backward of per-sample modulation: at least this many rows per program, so the fp32 partial
# sums (8 bytes per feature per program) stay small next to the rows a program reads.
MIN_ROWS_PER_PROGRAM = 8

# One-pass kernels: the widest row (a power of two) held in registers, forward and backward, and the
# elements per [BLOCK_M, BLOCK_D] tile (rows are added while the tile stays within it).
ROW_MAX_FWD = 8192
ROW_MAX_BWD = 4096
ROW_TILE_FWD = 4096
ROW_TILE_BWD = 2048

# Backward programs to aim for per streaming multiprocessor: enough resident warps to keep memory
# busy while each program walks its rows one block after the other.
PROGRAMS_PER_SM = 8


@triton.jit
def _modulation(PTR, b, n, stride_b, stride_n, cols, mask, PLUS_ONE: tl.constexpr):
    """The fp32 modulation tile of rows (sample ``b``, token ``n``): PTR's values, plus 1 with PLUS_ONE."""
    m = tl.load(PTR + b * stride_b + n * stride_n + cols, mask=mask, other=0.0).to(tl.float32)
    if PLUS_ONE:
        m = m + 1.0
    return m


@triton.jit
def _residual_input(X, H, GATE, XN, offs, b, n, cols, mask, stride_gate_b, stride_gate_n,
                    RESIDUAL: tl.constexpr, STORE_XN: tl.constexpr):
    """The fp32 [BLOCK_M, BLOCK_C] tile to normalise: X, or X + GATE * H rounded to XN's dtype."""
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if RESIDUAL:
        h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
        g = _modulation(GATE, b, n, stride_gate_b, stride_gate_n, cols, mask, False)
        xn = (x + g * h).to(XN.dtype.element_ty)
        if STORE_XN:
            tl.store(XN + offs, xn, mask=mask)
        x = xn.to(tl.float32)
    return x


@triton.jit
def _norm_affine_fwd_kernel(
    X, H, GATE, XN, Y, SHIFT, SCALE, MEAN, RSTD,
    M, N, D,
    stride_gate_b, stride_gate_n, stride_shift_b, stride_shift_n, stride_scale_b, stride_scale_n,
    eps,
    SCALE_PLUS_ONE: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
):
    # Program p normalises rows [p * BLOCK_M, (p + 1) * BLOCK_M) of the contiguous [B * N, D] input.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)   # [BLOCK_M]
    row_mask = rows < M
    b = (rows // N)[:, None]
    n = (rows % N)[:, None]
    row_off = rows[:, None] * D

    # Pass 1: the mean (and, RESIDUAL, the new residual written once).
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for c in range(NUM_CHUNKS):
        cols = c * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        mask = row_mask[:, None] & (cols < D)
        x = _residual_input(X, H, GATE, XN, row_off + cols, b, n, cols, mask, stride_gate_b, stride_gate_n,
                            RESIDUAL, True)
        acc += tl.sum(x, axis=1)
    mean = acc / D

    # Pass 2: the variance about the mean (two passes keep fp32 exact where E[x^2] - mean^2 is not).
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for c in range(NUM_CHUNKS):
        cols = c * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        mask = row_mask[:, None] & (cols < D)
        x = _residual_input(X, H, GATE, XN, row_off + cols, b, n, cols, mask, stride_gate_b, stride_gate_n,
                            RESIDUAL, False)
        xc = tl.where(mask, x - mean[:, None], 0.0)
        acc += tl.sum(xc * xc, axis=1)
    rstd = 1.0 / tl.sqrt(acc / D + eps)

    # Pass 3: normalise and modulate.
    for c in range(NUM_CHUNKS):
        cols = c * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        mask = row_mask[:, None] & (cols < D)
        x = _residual_input(X, H, GATE, XN, row_off + cols, b, n, cols, mask, stride_gate_b, stride_gate_n,
                            RESIDUAL, False)
        shift = _modulation(SHIFT, b, n, stride_shift_b, stride_shift_n, cols, mask, False)
        a = _modulation(SCALE, b, n, stride_scale_b, stride_scale_n, cols, mask, SCALE_PLUS_ONE)
        y = (x - mean[:, None]) * rstd[:, None] * a + shift
        tl.store(Y + row_off + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _norm_affine_bwd_kernel(
    DY, DXN, X, H, GATE, SCALE, MEAN, RSTD, DX, DH, DGATE, DSHIFT, DSCALE,
    N, D, rows_per_program, programs_per_sample,
    stride_gate_b, stride_gate_n, stride_scale_b, stride_scale_n,
    SCALE_PLUS_ONE: tl.constexpr,
    RESIDUAL: tl.constexpr,
    HAS_DXN: tl.constexpr,
    PER_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
):
    # Program p walks rows [n_start, n_end) of sample b, BLOCK_M at a time. X is the normalised
    # input (the new residual under RESIDUAL). DSHIFT/DSCALE/DGATE are [B * N, D] in the
    # modulation's dtypes when PER_ROW, else zeroed fp32 partial sums [B * programs_per_sample, D].
    pid = tl.program_id(0).to(tl.int64)
    b = pid // programs_per_sample
    n_start = (pid % programs_per_sample) * rows_per_program
    n_end = tl.minimum(n_start + rows_per_program, N)
    for n0 in range(n_start, n_end, BLOCK_M):
        ns = n0 + tl.arange(0, BLOCK_M)                                     # [BLOCK_M]
        row_mask = ns < n_end
        rows = b * N + ns
        row_off = rows[:, None] * D
        n = ns[:, None]
        mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)[:, None]
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)[:, None]

        # Pass 1: the row sums mean(g) and mean(g * xhat).
        sum_g = tl.zeros([BLOCK_M], dtype=tl.float32)
        sum_gx = tl.zeros([BLOCK_M], dtype=tl.float32)
        for c in range(NUM_CHUNKS):
            cols = c * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
            mask = row_mask[:, None] & (cols < D)
            x = tl.load(X + row_off + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + row_off + cols, mask=mask, other=0.0).to(tl.float32)
            a = _modulation(SCALE, b, n, stride_scale_b, stride_scale_n, cols, mask, SCALE_PLUS_ONE)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            g = dy * a
            sum_g += tl.sum(g, axis=1)
            sum_gx += tl.sum(g * xhat, axis=1)
        mean_g = (sum_g / D)[:, None]
        mean_gx = (sum_gx / D)[:, None]

        # Pass 2: dx (and the residual's gradients), and the modulation gradients.
        for c in range(NUM_CHUNKS):
            cols = c * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
            mask = row_mask[:, None] & (cols < D)
            offs = row_off + cols
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
            a = _modulation(SCALE, b, n, stride_scale_b, stride_scale_n, cols, mask, SCALE_PLUS_ONE)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            dx = (dy * a - mean_g - xhat * mean_gx) * rstd
            if HAS_DXN:
                dx += tl.load(DXN + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
            if RESIDUAL:
                h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
                gate = _modulation(GATE, b, n, stride_gate_b, stride_gate_n, cols, mask, False)
                tl.store(DH + offs, (dx * gate).to(DH.dtype.element_ty), mask=mask)
            if PER_ROW:
                tl.store(DSHIFT + offs, dy.to(DSHIFT.dtype.element_ty), mask=mask)
                tl.store(DSCALE + offs, (dy * xhat).to(DSCALE.dtype.element_ty), mask=mask)
                if RESIDUAL:
                    tl.store(DGATE + offs, (dx * h).to(DGATE.dtype.element_ty), mask=mask)
            else:
                # This program's own row of the partial-sum buffers: no other program touches it.
                pcols = pid * D + tl.arange(0, BLOCK_C) + c * BLOCK_C
                cmask = (tl.arange(0, BLOCK_C) + c * BLOCK_C) < D
                tl.store(DSHIFT + pcols, tl.load(DSHIFT + pcols, mask=cmask) + tl.sum(dy, axis=0), mask=cmask)
                tl.store(DSCALE + pcols, tl.load(DSCALE + pcols, mask=cmask) + tl.sum(dy * xhat, axis=0), mask=cmask)
                if RESIDUAL:
                    tl.store(DGATE + pcols, tl.load(DGATE + pcols, mask=cmask) + tl.sum(dx * h, axis=0), mask=cmask)
        if not PER_ROW:
            # The next row block reads these partial sums back, possibly in other threads of this
            # program (a reduced vector is spread over several threads): make the stores visible.
            tl.debug_barrier()


@triton.jit
def _row_fwd_kernel(
    X, H, GATE, XN, Y, SHIFT, SCALE, MEAN, RSTD,
    M, N, D,
    stride_gate_b, stride_gate_n, stride_shift_b, stride_shift_n, stride_scale_b, stride_scale_n,
    eps,
    SCALE_PLUS_ONE: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Program p normalises rows [p * BLOCK_M, (p + 1) * BLOCK_M), each whole in one [BLOCK_M, BLOCK_D] tile.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)   # [BLOCK_M]
    row_mask = rows < M
    b = (rows // N)[:, None]
    n = (rows % N)[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    mask = row_mask[:, None] & (cols < D)
    offs = rows[:, None] * D + cols

    x = _residual_input(X, H, GATE, XN, offs, b, n, cols, mask, stride_gate_b, stride_gate_n, RESIDUAL, True)
    mean = tl.sum(x, axis=1) / D
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / D + eps)   # about the mean: exact where E[x^2] - mean^2 is not
    shift = _modulation(SHIFT, b, n, stride_shift_b, stride_shift_n, cols, mask, False)
    a = _modulation(SCALE, b, n, stride_scale_b, stride_scale_n, cols, mask, SCALE_PLUS_ONE)
    y = xc * rstd[:, None] * a + shift
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _row_bwd_kernel(
    DY, DXN, X, H, GATE, SCALE, MEAN, RSTD, DX, DH, DGATE, DSHIFT, DSCALE,
    N, D, rows_per_program, programs_per_sample,
    stride_gate_b, stride_gate_n, stride_scale_b, stride_scale_n,
    SCALE_PLUS_ONE: tl.constexpr,
    RESIDUAL: tl.constexpr,
    HAS_DXN: tl.constexpr,
    PER_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Program p walks rows [n_start, n_end) of sample b, BLOCK_M whole rows at a time, reading each
    # element of X, DY (and H, DXN) once. DSHIFT/DSCALE/DGATE are [B * N, D] in the modulation's
    # dtypes when PER_ROW, else fp32 partial sums [B * programs_per_sample, D], one row per program,
    # summed in registers over the program's rows and stored once at the end.
    pid = tl.program_id(0).to(tl.int64)
    b = pid // programs_per_sample
    n_start = (pid % programs_per_sample) * rows_per_program
    n_end = tl.minimum(n_start + rows_per_program, N)
    cols1 = tl.arange(0, BLOCK_D)
    cmask1 = cols1 < D
    cols = cols1[None, :]
    if not PER_ROW:  # one modulation row for all of this program's rows
        a_row = _modulation(SCALE, b, 0, stride_scale_b, 0, cols1, cmask1, SCALE_PLUS_ONE)
        if RESIDUAL:
            gate_row = _modulation(GATE, b, 0, stride_gate_b, 0, cols1, cmask1, False)
        acc_shift = tl.zeros([BLOCK_D], dtype=tl.float32)
        acc_scale = tl.zeros([BLOCK_D], dtype=tl.float32)
        acc_gate = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(n_start, n_end, BLOCK_M):
        ns = n0 + tl.arange(0, BLOCK_M)                                     # [BLOCK_M]
        row_mask = ns < n_end
        rows = b * N + ns
        mask = row_mask[:, None] & cmask1[None, :]
        offs = rows[:, None] * D + cols
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)[:, None]
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)[:, None]
        if PER_ROW:
            a = _modulation(SCALE, b, ns[:, None], stride_scale_b, stride_scale_n, cols, mask, SCALE_PLUS_ONE)
        else:
            a = a_row[None, :]
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = dy * a
        mean_g = (tl.sum(g, axis=1) / D)[:, None]
        mean_gx = (tl.sum(g * xhat, axis=1) / D)[:, None]
        dx = (g - mean_g - xhat * mean_gx) * rstd
        if HAS_DXN:
            dx += tl.load(DXN + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        if RESIDUAL:
            h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
            if PER_ROW:
                gate = _modulation(GATE, b, ns[:, None], stride_gate_b, stride_gate_n, cols, mask, False)
            else:
                gate = gate_row[None, :]
            tl.store(DH + offs, (dx * gate).to(DH.dtype.element_ty), mask=mask)
        if PER_ROW:
            tl.store(DSHIFT + offs, dy.to(DSHIFT.dtype.element_ty), mask=mask)
            tl.store(DSCALE + offs, (dy * xhat).to(DSCALE.dtype.element_ty), mask=mask)
            if RESIDUAL:
                tl.store(DGATE + offs, (dx * h).to(DGATE.dtype.element_ty), mask=mask)
        else:
            acc_shift += tl.sum(dy, axis=0)
            acc_scale += tl.sum(dy * xhat, axis=0)
            if RESIDUAL:
                acc_gate += tl.sum(dx * h, axis=0)  # h is 0 off the rows and columns
    if not PER_ROW:
        tl.store(DSHIFT + pid * D + cols1, acc_shift, mask=cmask1)
        tl.store(DSCALE + pid * D + cols1, acc_scale, mask=cmask1)
        if RESIDUAL:
            tl.store(DGATE + pid * D + cols1, acc_gate, mask=cmask1)


# Kernels decorated while TRITON_INTERPRET=1 was set run in Triton's interpreter, which executes
# them on CPU tensors too (slowly); compiled kernels need CUDA tensors.
KERNELS_INTERPRETED = not isinstance(_norm_affine_fwd_kernel, JITFunction)


def runs_on(tensor: torch.Tensor) -> bool:
    """Whether these kernels can take ``tensor``: a CUDA tensor, or any tensor under the interpreter."""
    return tensor.is_cuda or KERNELS_INTERPRETED


def column_block(dim: int) -> int:
    """The power-of-two column chunk for rows of ``dim`` features: the widest (at most
    ``MAX_BLOCK_C``) whose chunks leave at most ``MAX_IDLE_FRACTION`` of their lanes idle, else the
    one with the fewest idle lanes. D = 1152 -> 128 (9 full chunks); D = 1024 -> 1024."""
    best, best_idle = None, None
    block = min(triton.next_power_of_2(dim), MAX_BLOCK_C)
    while block >= MIN_BLOCK_C:
        lanes = triton.cdiv(dim, block) * block
        idle = (lanes - dim) / lanes
        if idle <= MAX_IDLE_FRACTION:
            return block
        if best_idle is None or idle < best_idle:
            best, best_idle = block, idle
        block //= 2
    return best if best is not None else MIN_BLOCK_C


def launch_settings(rows: int, dim: int) -> Tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_C, NUM_CHUNKS, num_warps)`` for ``rows`` rows of ``dim`` features."""
    block_c = column_block(dim)
    block_m = max(1, min(MAX_BLOCK_M, TILE_ELEMENTS // block_c, triton.next_power_of_2(max(rows, 1))))
    num_warps = 8 if block_m * block_c >= 4096 else 4
    return block_m, block_c, triton.cdiv(dim, block_c), num_warps


def uses_row_kernels(dim: int, backward: bool) -> bool:
    """Whether rows of ``dim`` features take the one-pass kernels (the row fits in registers) rather
    than the column-chunked ones."""
    return triton.next_power_of_2(dim) <= (ROW_MAX_BWD if backward else ROW_MAX_FWD)


def row_settings(rows: int, dim: int, backward: bool) -> Tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_D, num_warps)`` of the one-pass kernels for ``rows`` rows of ``dim`` features."""
    block_d = triton.next_power_of_2(dim)
    tile = ROW_TILE_BWD if backward else ROW_TILE_FWD
    block_m = max(1, min(MAX_BLOCK_M, tile // block_d, triton.next_power_of_2(max(rows, 1))))
    elements = block_m * block_d
    num_warps = 16 if elements >= 16384 else 8 if elements >= 2048 else 4 if elements >= 512 else 2
    return block_m, block_d, num_warps


def split_rows(batch: int, seq: int, device: torch.device, multiple: int = 1) -> Tuple[int, int]:
    """``(programs_per_sample, rows_per_program)`` for the per-sample backward.

    Aims at ``PROGRAMS_PER_SM`` programs per streaming multiprocessor over the whole batch (8 in
    all under the interpreter), with at least ``MIN_ROWS_PER_PROGRAM`` rows each, rounded up to a
    ``multiple`` of the row block.
    """
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    programs = max(1, min(triton.cdiv(PROGRAMS_PER_SM * sms, batch), triton.cdiv(seq, MIN_ROWS_PER_PROGRAM)))
    rows = triton.cdiv(triton.cdiv(seq, programs), multiple) * multiple
    return triton.cdiv(seq, rows), rows  # recount so that no program is left without rows


def _mod_strides(mod: Optional[torch.Tensor]) -> Tuple[int, int]:
    """Element strides of a [B|1, N|1, D] modulation tensor over samples and tokens; 0 broadcasts."""
    if mod is None:
        return 0, 0
    stride_b = mod.stride(0) if mod.size(0) > 1 else 0
    stride_n = mod.stride(1) if mod.size(1) > 1 else 0
    return stride_b, stride_n


def _forward(x, h, gate, xn_dtype, shift, scale, eps, scale_plus_one, out_dtype):
    B, N, D = x.shape
    residual = h is not None
    xn = torch.empty((B, N, D), dtype=xn_dtype, device=x.device) if residual else x
    y = torch.empty((B, N, D), dtype=out_dtype, device=x.device)
    mean = torch.empty(B * N, dtype=torch.float32, device=x.device)
    rstd = torch.empty(B * N, dtype=torch.float32, device=x.device)
    args = (x, h if residual else x, gate if residual else x, xn, y, shift, scale, mean, rstd,
            B * N, N, D, *_mod_strides(gate), *_mod_strides(shift), *_mod_strides(scale), eps)
    if uses_row_kernels(D, backward=False):
        block_m, block_d, num_warps = row_settings(B * N, D, backward=False)
        _row_fwd_kernel[(triton.cdiv(B * N, block_m),)](
            *args, SCALE_PLUS_ONE=scale_plus_one, RESIDUAL=residual, BLOCK_M=block_m, BLOCK_D=block_d,
            num_warps=num_warps,
        )
    else:
        block_m, block_c, chunks, num_warps = launch_settings(B * N, D)
        _norm_affine_fwd_kernel[(triton.cdiv(B * N, block_m),)](
            *args, SCALE_PLUS_ONE=scale_plus_one, RESIDUAL=residual,
            BLOCK_M=block_m, BLOCK_C=block_c, NUM_CHUNKS=chunks, num_warps=num_warps,
        )
    return xn, y, mean, rstd


def norm_affine_forward(
    x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float, scale_plus_one: bool,
    out_dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel.

    x: contiguous [B, N, D]; shift, scale: [B|1, N|1, D] with unit stride over D (any strides
    elsewhere, so chunks of a larger adaLN projection need no copy).
    Returns y [B, N, D] in ``out_dtype`` and fp32 mean, rstd [B * N] for the backward.
    """
    _, y, mean, rstd = _forward(x, None, None, None, shift, scale, eps, scale_plus_one, out_dtype)
    return y, mean, rstd


def gated_residual_norm_forward(
    x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
    scale_plus_one: bool, xn_dtype: torch.dtype, out_dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel with the gated residual: ``x_new = x + gate * h`` and
    ``LayerNorm(x_new) * a + shift`` with ``a = 1 + scale`` (``scale_plus_one``) or ``scale``.

    x, h: contiguous [B, N, D]; gate, shift, scale: [B|1, N|1, D] with unit stride over D.
    Returns x_new [B, N, D] in ``xn_dtype``, y [B, N, D] in ``out_dtype``, fp32 mean, rstd [B * N].
    """
    return _forward(x, h, gate, xn_dtype, shift, scale, eps, scale_plus_one, out_dtype)


def _backward(dy, dxn, x, h, gate, scale, mean, rstd, scale_plus_one, dx_dtype, shift_dtype):
    B, N, D = x.shape
    one_pass = uses_row_kernels(D, backward=True)
    if one_pass:
        block_m, block_d, num_warps = row_settings(B * N, D, backward=True)
    else:
        block_m, block_c, chunks, num_warps = launch_settings(B * N, D)
    residual = h is not None
    per_row = scale.size(1) == N and N > 1
    dx = torch.empty((B, N, D), dtype=dx_dtype, device=x.device)
    dh = torch.empty_like(h) if residual else dx
    if per_row:
        programs, rows = triton.cdiv(N, block_m), block_m
        dshift = torch.empty((B, N, D), dtype=shift_dtype, device=x.device)
        dscale = torch.empty((B, N, D), dtype=scale.dtype, device=x.device)
        dgate = torch.empty((B, N, D), dtype=gate.dtype, device=x.device) if residual else dshift
    else:
        programs, rows = split_rows(B, N, x.device, multiple=block_m)
        # the one-pass kernel writes each program's row once; the chunked one adds into it
        new = torch.empty if one_pass else torch.zeros
        dshift = new((B, programs, D), dtype=torch.float32, device=x.device)
        dscale = new((B, programs, D), dtype=torch.float32, device=x.device)
        dgate = new((B, programs, D), dtype=torch.float32, device=x.device) if residual else dshift
    args = (dy, dxn if dxn is not None else dy, x, h if residual else x, gate if residual else scale, scale, mean,
            rstd, dx, dh, dgate, dshift, dscale, N, D, rows, programs, *_mod_strides(gate), *_mod_strides(scale))
    flags = dict(SCALE_PLUS_ONE=scale_plus_one, RESIDUAL=residual, HAS_DXN=dxn is not None, PER_ROW=per_row)
    if one_pass:
        _row_bwd_kernel[(B * programs,)](*args, **flags, BLOCK_M=block_m, BLOCK_D=block_d, num_warps=num_warps)
    else:
        _norm_affine_bwd_kernel[(B * programs,)](*args, **flags, BLOCK_M=block_m, BLOCK_C=block_c,
                                                 NUM_CHUNKS=chunks, num_warps=num_warps)
    if not per_row:
        # [B, J, D] fp32 partial sums -> [B, 1, D], rounded once to the parameter's dtype.
        dshift = dshift.sum(dim=1, keepdim=True).to(shift_dtype)
        dscale = dscale.sum(dim=1, keepdim=True).to(scale.dtype)
        if residual:
            dgate = dgate.sum(dim=1, keepdim=True).to(gate.dtype)
    return dx, dh, dgate, dshift, dscale


def norm_affine_backward(
    dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
    scale_plus_one: bool, shift_dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernel.

    dy, x: contiguous [B, N, D]; scale as in the forward, [B, N|1, D]; mean, rstd from the forward.
    Returns dx [B, N, D] in x's dtype, dshift and dscale shaped [B, N|1, D] in ``shift_dtype`` and
    scale's dtype.
    """
    dx, _, _, dshift, dscale = _backward(dy, None, x, None, None, scale, mean, rstd, scale_plus_one,
                                         x.dtype, shift_dtype)
    return dx, dshift, dscale


def gated_residual_norm_backward(
    dy: torch.Tensor, dxn: Optional[torch.Tensor], x_new: torch.Tensor, h: torch.Tensor, gate: torch.Tensor,
    scale: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, scale_plus_one: bool, x_dtype: torch.dtype,
    shift_dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernel with the gated residual.

    dy: contiguous [B, N, D] gradient of the modulated output; dxn: None or the contiguous [B, N, D]
    gradient of x_new from its other uses; x_new, h: contiguous [B, N, D]; gate, scale as in the
    forward. Returns dx (``x_dtype``), dh [B, N, D] and dgate, dshift, dscale [B, N|1, D].
    """
    return _backward(dy, dxn, x_new, h, gate, scale, mean, rstd, scale_plus_one, x_dtype, shift_dtype)
