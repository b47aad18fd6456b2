"""Benchmark the fused AdaLN kernel (LayerNorm + modulate, forward and backward) on one GPU.

    python benchmarks/bench_fused_adaln.py                  # every shape of the issue, bf16
    python benchmarks/bench_fused_adaln.py --quick          # two small shapes, a smoke run
    python benchmarks/bench_fused_adaln.py --shapes report  # the five shapes of benchmarks/gpu_report.py
    python benchmarks/bench_fused_adaln.py --layout token   # per-token modulation [B, N, D]
    python benchmarks/bench_fused_adaln.py --op residual    # adaLN-Zero gated residual + next norm

Providers: ``eager`` (``reference_adaln`` from tests/kernels/test_fused_adaln.py: torch LayerNorm,
then the multiply and add, as ``LayerNormModulate`` runs), ``compile`` (``torch.compile`` of the
same function) and ``triton`` (the kernel behind ``opendit_lite.kernels.fused_adaln``, past the
dispatch that may serve a shape with the compiled torch path: ``kernel_choice.py``). Writes
benchmarks/results/fused_adaln[_token]_<gpu>.csv and .png.

Effective bandwidth counts the bytes an ideal fused implementation must move, the same for every
provider (M = B*N rows of D features, s bytes per element, per-sample modulation [B, D]):

* forward:  read x (M*D*s) and shift, scale (2*B*D*s); write y (M*D*s) and fp32 mean, rstd (2*M*4);
* backward: read dy, x (2*M*D*s), scale (B*D*s), mean, rstd (2*M*4); write dx (M*D*s) and
  dshift, dscale (2*B*D*s);
* full: the sum.

Per-token modulation counts M rows of shift/scale instead of B.

``--op residual`` times ``gated_residual_adaln`` (x_new = x + gate * h, then the AdaLN of x_new)
against ``reference_gated_residual`` from tests/kernels/test_gated_residual.py, eager and
compiled, with a gradient flowing into both outputs. Bytes counted:

* forward:  read x, h (2*M*D*s), gate, shift, scale (3*B*D*s); write x_new, y (2*M*D*s), mean, rstd;
* backward: read dy, dx_new, x_new, h (4*M*D*s), gate, scale (2*B*D*s), mean, rstd; write dx, dh
  (2*M*D*s) and dgate, dshift, dscale (3*B*D*s). Targets (issue 4, bf16): full >=
2x eager, >= 1.0x compile and >= 80% of the measured copy bandwidth on every shape.
"""

from typing import Tuple

import common
import torch

# (B, N, D): DiT-XL/2 at 256px (N = 16 x 16 patches), then video latents with 8k..64k tokens.
DIT_SHAPES = [(b, 256, 1152) for b in (32, 64, 128, 256)]
VIDEO_SHAPES = [(b, n, 1152) for b in (1, 2, 4) for n in (8192, 16384, 32768, 65536)]
QUICK_SHAPES = [(8, 256, 1152), (1, 8192, 1152)]
# The report's set (benchmarks/gpu_report.py): DiT-XL/2 at 256 px with batches 128 and 256, then
# video latents of 16k to 64k tokens; each moves 75-300 MB per pass, far beyond the L2.
REPORT_SHAPES = [(128, 256, 1152), (256, 256, 1152), (1, 16384, 1152), (2, 32768, 1152), (1, 65536, 1152)]
SHAPE_SETS = {"all": DIT_SHAPES + VIDEO_SHAPES, "report": REPORT_SHAPES, "quick": QUICK_SHAPES}

EPS = 1e-6


def bytes_moved(B: int, N: int, D: int, elem: int, layout: str) -> dict:
    M = B * N
    mod_rows = M if layout == "token" else B
    forward = M * D * elem + 2 * mod_rows * D * elem + M * D * elem + 2 * M * 4
    backward = 2 * M * D * elem + mod_rows * D * elem + 2 * M * 4 + M * D * elem + 2 * mod_rows * D * elem
    return {"forward": forward, "backward": backward, "full": forward + backward}


def residual_bytes_moved(B: int, N: int, D: int, elem: int, layout: str) -> dict:
    M = B * N
    mod_rows = M if layout == "token" else B
    forward = 2 * M * D * elem + 3 * mod_rows * D * elem + 2 * M * D * elem + 2 * M * 4
    backward = 4 * M * D * elem + 2 * mod_rows * D * elem + 2 * M * 4 + 2 * M * D * elem + 3 * mod_rows * D * elem
    return {"forward": forward, "backward": backward, "full": forward + backward}


def residual_providers(compile_backend: str = "inductor"):
    from opendit_lite.kernels.gated_residual import gated_residual_adaln_triton
    from tests.kernels.test_gated_residual import reference_gated_residual

    torch._dynamo.reset()
    compiled = torch.compile(reference_gated_residual, dynamic=False, backend=compile_backend)
    return {
        "eager": lambda *a: reference_gated_residual(*a, EPS),
        "compile": lambda *a: compiled(*a, EPS),
        "triton": lambda *a: gated_residual_adaln_triton(*a, EPS),  # the kernel itself, past the dispatch
    }


def bench_residual_shape(shape: Tuple[int, int, int], layout: str, dtype: torch.dtype, copy_gbps: float, rep: int,
                         info, device: str = "cuda", compile_backend: str = "inductor", timer: str = "graph"):
    B, N, D = shape
    mod_shape = (B, N, D) if layout == "token" else (B, D)
    x, h = (torch.randn(B, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    gate, shift, scale = ((0.5 * torch.randn(mod_shape, device=device, dtype=dtype)).requires_grad_() for _ in range(3))
    dy = torch.randn(B, N, D, device=device, dtype=dtype)
    return common.bench_providers(
        "gated_residual", f"B{B} N{N} D{D} {layout}", residual_providers(compile_backend), (x, h, gate, shift, scale),
        dy, info, rep,
        bytes_moved=residual_bytes_moved(B, N, D, x.element_size(), layout), copy_gbps=copy_gbps, timer=timer,
    )


def providers(compile_backend: str = "inductor"):
    from opendit_lite.kernels.adaln import adaln_triton
    from tests.kernels.test_fused_adaln import reference_adaln

    torch._dynamo.reset()  # a fresh compile per shape; the recompile limit would fall back to eager
    compiled = torch.compile(reference_adaln, dynamic=False, backend=compile_backend)
    return {
        "eager": lambda x, s, c: reference_adaln(x, s, c, EPS),
        "compile": lambda x, s, c: compiled(x, s, c, EPS),
        "triton": lambda x, s, c: adaln_triton(x, s, c, EPS),  # the kernel itself, past the dispatch
    }


def bench_shape(shape: Tuple[int, int, int], layout: str, dtype: torch.dtype, copy_gbps: float, rep: int, info,
                device: str = "cuda", compile_backend: str = "inductor", timer: str = "graph"):
    B, N, D = shape
    mod_shape = (B, N, D) if layout == "token" else (B, D)
    x = torch.randn(B, N, D, device=device, dtype=dtype, requires_grad=True)
    shift = (0.5 * torch.randn(mod_shape, device=device, dtype=dtype)).requires_grad_()
    scale = (0.5 * torch.randn(mod_shape, device=device, dtype=dtype)).requires_grad_()
    dy = torch.randn(B, N, D, device=device, dtype=dtype)
    return common.bench_providers(
        "fused_adaln", f"B{B} N{N} D{D} {layout}", providers(compile_backend), (x, shift, scale), dy, info, rep,
        bytes_moved=bytes_moved(B, N, D, x.element_size(), layout), copy_gbps=copy_gbps, timer=timer,
    )


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--layout", choices=("sample", "token"), default="sample",
                        help="shift/scale per sample [B, D] (DiT) or per token [B, N, D]")
    parser.add_argument("--op", choices=("adaln", "residual"), default="adaln",
                        help="adaln: LayerNorm + modulate; residual: gated residual + the next LayerNorm + modulate")
    parser.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="all",
                        help="all: every DiT and video shape; report: the five of gpu_report.py; quick: as --quick")
    args = parser.parse_args()
    dtype, rep, info, copy_gbps = common.setup(args)
    bench = bench_shape if args.op == "adaln" else bench_residual_shape
    rows = []
    for shape in QUICK_SHAPES if args.quick else SHAPE_SETS[args.shapes]:
        rows += bench(shape, args.layout, dtype, copy_gbps, rep, info, timer=args.timer)
    kernel = ("fused_adaln" if args.op == "adaln" else "gated_residual") + ("_token" if args.layout == "token" else "")
    common.finish(rows, kernel, args.quick, "gbps", "effective GB/s", "eager",
                  copy_gbps, "device copy bandwidth")


if __name__ == "__main__":
    main()
