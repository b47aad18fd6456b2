"""Benchmark the attention backends (forward, backward, full) on one GPU.

    python benchmarks/bench_attention.py            # DiT-XL/2 and video shapes, bf16
    python benchmarks/bench_attention.py --quick    # two small shapes, a smoke run

Providers: ``sdpa`` (``SDPAAttentionOp``: torch's scaled_dot_product_attention, which picks its own
flash / memory-efficient kernel) and ``flash`` (``FlashAttentionOp``: flash-attn's
``flash_attn_func``, when flash-attn imports). Both take q, k, v as [B, N, H, Dh]. Speedups are
against ``sdpa``. Writes benchmarks/results/attention_<gpu>.csv and .png.

Attention is compute-bound, so the rate reported is TFLOP/s, counting the two matrix products of
the forward as 4*B*H*N^2*Dh FLOPs, the backward as 2.5 times that (five products, one of them the
recomputed scores) and full as 3.5 times.
"""

from typing import Tuple

import torch

import common

HEADS, HEAD_DIM = 16, 72  # DiT-XL: hidden size 1152 = 16 heads x 72
DIT_SHAPES = [(b, 256) for b in (32, 64, 128, 256)]
VIDEO_SHAPES = [(1, n) for n in (8192, 16384, 32768, 65536)]
QUICK_SHAPES = [(8, 256), (1, 8192)]


def providers():
    from opendit_lite.kernels import FlashAttentionOp, flash_attn_version
    from opendit_lite.models.layers import SDPAAttentionOp

    found = {"sdpa": SDPAAttentionOp()}
    if flash_attn_version() is not None:
        found["flash"] = FlashAttentionOp()
    else:
        print("flash-attn is not installed: timing sdpa only")
    return found


def bench_shape(shape: Tuple[int, int], ops, dtype: torch.dtype, rep: int, info):
    B, N = shape
    q, k, v = (torch.randn(B, N, HEADS, HEAD_DIM, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    dy = torch.randn(B, N, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    forward = 4 * B * HEADS * N * N * HEAD_DIM
    return common.bench_providers(
        "attention", f"B{B} N{N} H{HEADS} Dh{HEAD_DIM}", ops, (q, k, v), dy, info, rep,
        flops={"forward": forward, "backward": 2.5 * forward, "full": 3.5 * forward},
    )


def main() -> None:
    args = common.base_parser(__doc__).parse_args()
    dtype, rep, info, _ = common.setup(args, measure_copy=False)
    ops = providers()
    rows = []
    for shape in QUICK_SHAPES if args.quick else DIT_SHAPES + VIDEO_SHAPES:
        rows += bench_shape(shape, ops, dtype, rep, info)
    common.finish(rows, "attention", args.quick, "tflops", "TFLOP/s", baseline="sdpa")


if __name__ == "__main__":
    main()
