"""Benchmark the Triton LayerNorm (with weight and bias, forward and backward) on one GPU.

    python benchmarks/bench_layernorm.py            # every shape of the issue, bf16
    python benchmarks/bench_layernorm.py --quick    # two small shapes, a smoke run
    python benchmarks/bench_layernorm.py --shapes report   # the five shapes of benchmarks/gpu_report.py

Providers: ``eager`` (``reference_layer_norm`` from tests/kernels/test_layernorm.py, i.e. torch's
LayerNorm), ``compile`` (``torch.compile`` of it), ``triton`` (``opendit_lite.kernels.triton_layer_norm``)
and ``apex`` (``apex.normalization.FusedLayerNorm``'s function, when apex imports). Weight and bias
are in the input's dtype, as in a bf16 model. Writes benchmarks/results/layernorm_<gpu>.csv and .png.

Effective bandwidth counts, with M rows of D features, s bytes per element:

* forward:  read x (M*D*s), weight, bias (2*D*s); write y (M*D*s), fp32 mean, rstd (2*M*4);
* backward: read dy, x (2*M*D*s), weight (D*s), mean, rstd (2*M*4); write dx (M*D*s), dweight, dbias (2*D*s);
* full: the sum.

Target (issue 4, bf16): Triton at least as fast as eager torch on every shape.
"""

from typing import Tuple

import common
import torch
from bench_fused_adaln import QUICK_SHAPES, SHAPE_SETS

EPS = 1e-5


def bytes_moved(M: int, D: int, elem: int) -> dict:
    forward = M * D * elem + 2 * D * elem + M * D * elem + 2 * M * 4
    backward = 2 * M * D * elem + D * elem + 2 * M * 4 + M * D * elem + 2 * D * elem
    return {"forward": forward, "backward": backward, "full": forward + backward}


def providers(compile_backend: str = "inductor"):
    from opendit_lite.kernels.layernorm import _apex_fused_layernorm_cls, layer_norm_triton
    from tests.kernels.test_layernorm import reference_layer_norm

    torch._dynamo.reset()  # a fresh compile per shape; the recompile limit would fall back to eager
    compiled = torch.compile(reference_layer_norm, dynamic=False, backend=compile_backend)
    found = {
        "eager": lambda x, w, b: reference_layer_norm(x, w, b, EPS),
        "compile": lambda x, w, b: compiled(x, w, b, EPS),
        "triton": lambda x, w, b: layer_norm_triton(x, w, b, EPS),  # the kernel itself, past the dispatch
    }
    if _apex_fused_layernorm_cls() is not None:
        from apex.normalization.fused_layer_norm import fused_layer_norm_affine

        found["apex"] = lambda x, w, b: fused_layer_norm_affine(x, w, b, (x.size(-1),), EPS)
    return found


def bench_shape(shape: Tuple[int, int, int], dtype: torch.dtype, copy_gbps: float, rep: int, info,
                device: str = "cuda", compile_backend: str = "inductor", timer: str = "graph"):
    B, N, D = shape
    x = torch.randn(B, N, D, device=device, dtype=dtype, requires_grad=True)
    weight = (1 + 0.5 * torch.randn(D, device=device, dtype=dtype)).requires_grad_()
    bias = (0.5 * torch.randn(D, device=device, dtype=dtype)).requires_grad_()
    dy = torch.randn(B, N, D, device=device, dtype=dtype)
    return common.bench_providers(
        "layernorm", f"B{B} N{N} D{D}", providers(compile_backend), (x, weight, bias), dy, info, rep,
        bytes_moved=bytes_moved(B * N, D, x.element_size()), copy_gbps=copy_gbps, timer=timer,
    )


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="all",
                        help="all: every DiT and video shape; report: the five of gpu_report.py; quick: as --quick")
    args = parser.parse_args()
    dtype, rep, info, copy_gbps = common.setup(args)
    rows = []
    for shape in QUICK_SHAPES if args.quick else SHAPE_SETS[args.shapes]:
        rows += bench_shape(shape, dtype, copy_gbps, rep, info, timer=args.timer)
    common.finish(rows, "layernorm", args.quick, "gbps", "effective GB/s", "eager",
                  copy_gbps, "device copy bandwidth")


if __name__ == "__main__":
    main()
