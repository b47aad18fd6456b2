"""Benchmark attention kernels per head dimension (forward, backward, full) and pick the fastest.

    python benchmarks/bench_attention.py                       # head_dim 72 (DiT-XL), DiT and video shapes, bf16
    python benchmarks/bench_attention.py --head-dims 64 72 128 # a table per head_dim
    python benchmarks/bench_attention.py --quick               # two small shapes, a smoke run
    python benchmarks/bench_attention.py --device cpu --quick  # CPU smoke run: tiny shapes, wall-clock timing

Providers, all taking q, k, v as [B, N, H, Dh] (the layout of ``SDPAAttentionOp``):

* ``sdpa``: torch's scaled_dot_product_attention choosing its own backend (what the models run);
* ``sdpa-cudnn``, ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-math``: the same call restricted to one
  backend with ``torch.nn.attention.sdpa_kernel``;
* ``flash-attn``: flash-attn's ``flash_attn_func`` (``FlashAttentionOp``), when it imports;
* ``pad<P>`` (P = 80, 96, 128, each larger than Dh): q, k, v zero-padded to head_dim P, SDPA with
  the softmax scale of Dh, output sliced back. Zero columns add nothing to q.k and give zero output
  columns, so the result is exact; it pays when a kernel is much faster at P than at Dh.

A provider that cannot take the inputs (a backend not built for this GPU, dtype or head_dim)
is listed as unavailable with torch's reason. Each head_dim gets a table (p50 ms per mode and
shape, speedup over ``sdpa``) and the provider with the smallest total "full" time over the
shapes is named the fastest. On a GPU the rows also go to benchmarks/results/attention_<gpu>.csv
and .png; TFLOP/s counts the forward as 4*B*H*N^2*Dh FLOPs (the unpadded Dh), the backward as
2.5 times that and full as 3.5 times.
"""

import math
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import common
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS = 16
DEFAULT_HEAD_DIMS = (72,)  # DiT-XL: hidden size 1152 = 16 heads x 72
DIT_SHAPES = [(b, 256) for b in (32, 64, 128, 256)]
VIDEO_SHAPES = [(1, n) for n in (8192, 16384, 32768, 65536)]
QUICK_SHAPES = [(8, 256), (1, 8192)]
CPU_SHAPES = [(1, 16), (2, 24)]
CPU_HEADS = 2
PAD_TO = (80, 96, 128)

SDPA_BACKENDS = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """[B, N, H, Dh] in and out, as ``SDPAAttentionOp``."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
    return out.transpose(1, 2)


def sdpa_with(backend: SDPBackend) -> Attention:
    def run(q, k, v):
        with sdpa_kernel(backend):
            return sdpa(q, k, v)

    return run


def padded(pad_to: int) -> Attention:
    """SDPA on q, k, v zero-padded from Dh to ``pad_to`` features, with Dh's softmax scale."""

    def run(q, k, v):
        head_dim = q.shape[-1]
        q, k, v = (F.pad(t, (0, pad_to - head_dim)) for t in (q, k, v))
        return sdpa(q, k, v, scale=1 / math.sqrt(head_dim))[..., :head_dim]

    return run


def providers(head_dim: int) -> Dict[str, Attention]:
    from opendit_lite.kernels import FlashAttentionOp, flash_attn_version

    found: Dict[str, Attention] = {"sdpa": sdpa, **{name: sdpa_with(b) for name, b in SDPA_BACKENDS.items()}}
    if flash_attn_version() is not None:
        found["flash-attn"] = FlashAttentionOp()
    found.update({f"pad{p}": padded(p) for p in PAD_TO if p > head_dim})
    return found


def unavailable_reason(fn: Attention, inputs: Sequence[torch.Tensor]) -> Optional[str]:
    """None when ``fn`` runs forward and backward on ``inputs``, else torch's first line of why not."""
    try:
        out = fn(*inputs)
        out.sum().backward()
    except RuntimeError as e:  # "No available kernel", unsupported head_dim/dtype/GPU
        return str(e).strip().splitlines()[0][:120]
    finally:
        for t in inputs:
            t.grad = None
    return None


def wall_clock_ms(call: Callable[[], object], rep: int) -> List[float]:
    """[p20, p50, p80] milliseconds of ``call`` by the wall clock (CPU smoke runs)."""
    call()
    times = []
    for _ in range(max(3, rep)):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    q = statistics.quantiles(times, n=10)
    return [q[1], statistics.median(times), q[7]]


def bench_head_dim(head_dim: int, shapes, heads: int, device: str, dtype: torch.dtype, rep: int,
                   info, timer: str = "graph") -> Tuple[List[common.Row], Dict[str, str]]:
    """Rows for every available provider and shape, and {provider: reason} for those unavailable."""
    rows, skipped = [], {}
    for B, N in shapes:
        q, k, v = (torch.randn(B, N, heads, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        dy = torch.randn(B, N, heads, head_dim, device=device, dtype=dtype)
        forward = 4 * B * heads * N * N * head_dim
        flops = {"forward": forward, "backward": 2.5 * forward, "full": 3.5 * forward}
        fns = {}
        for name, fn in providers(head_dim).items():
            reason = skipped.get(name) or unavailable_reason(fn, (q, k, v))
            if reason is None:
                fns[name] = fn
            else:
                skipped[name] = reason
        label = f"B{B} N{N} H{heads} Dh{head_dim}"
        if device == "cuda":
            rows += common.bench_providers("attention", label, fns, (q, k, v), dy, info, rep, flops=flops,
                                           timer=timer)
            continue
        for name, fn in fns.items():
            for mode, call in common.modes_for(lambda: fn(q, k, v), dy).items():
                p20, p50, p80 = wall_clock_ms(call, rep)
                rows.append(common.Row(
                    kernel="attention", provider=name, mode=mode, shape=label, dtype=str(dtype).replace("torch.", ""),
                    ms_p20=p20, ms_p50=p50, ms_p80=p80, gbps=None, frac_of_copy_bw=None,
                    tflops=flops[mode] / (p50 * 1e-3) / 1e12, baseline="", speedup=None, peak_mem_mib=0.0,
                    gpu=info[0], torch_version=info[1], triton_version=info[2], timer="wall",
                ))
    return rows, skipped


def fastest(rows: List[common.Row]) -> str:
    """The provider with the smallest summed "full" p50 over the shapes it ran on all of."""
    shapes = {r.shape for r in rows}
    totals: Dict[str, List[float]] = {}
    for r in rows:
        if r.mode == "full":
            totals.setdefault(r.provider, []).append(r.ms_p50)
    complete = {p: sum(ms) for p, ms in totals.items() if len(ms) == len(shapes)}
    return min(complete, key=complete.get)


def print_table(head_dim: int, rows: List[common.Row], skipped: Dict[str, str]) -> str:
    """One table for ``head_dim``: p50 ms of forward / backward / full and the speedup over sdpa."""
    common.fill_speedups(rows, "sdpa")
    best = fastest(rows)
    print(f"\n== head_dim {head_dim}: p50 ms (forward / backward / full), full speedup over sdpa ==")
    shapes = list(dict.fromkeys(r.shape for r in rows))
    names = list(dict.fromkeys(r.provider for r in rows))
    cell = {(r.provider, r.shape, r.mode): r for r in rows}
    print(f"{'provider':<16}" + "".join(f"{s:>34}" for s in shapes))
    for name in names:
        parts = []
        for s in shapes:
            f, b, u = (cell.get((name, s, m)) for m in common.MODES)
            parts.append(f"{f.ms_p50:8.3f} /{b.ms_p50:8.3f} /{u.ms_p50:8.3f} x{u.speedup:4.2f}" if u else "-")
        print(f"{name + (' *' if name == best else ''):<16}" + "".join(f"{p:>34}" for p in parts))
    for name, reason in skipped.items():
        print(f"{name:<16} unavailable: {reason}")
    print(f"fastest for head_dim {head_dim}: {best}")
    return best


def main(argv: Optional[Sequence[str]] = None) -> Dict[int, str]:
    parser = common.base_parser(__doc__)
    parser.add_argument("--head-dims", type=int, nargs="+", default=list(DEFAULT_HEAD_DIMS))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke run of the script itself (tiny shapes, wall-clock times, no files)")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        dtype, rep, info = torch.float32, 3, ("cpu", torch.__version__, "-")
        shapes, heads = CPU_SHAPES, CPU_HEADS
    else:
        dtype, rep, info, _ = common.setup(args, measure_copy=False)
        shapes, heads = (QUICK_SHAPES if args.quick else DIT_SHAPES + VIDEO_SHAPES), HEADS
    picks, all_rows = {}, []
    for head_dim in args.head_dims:
        rows, skipped = bench_head_dim(head_dim, shapes, heads, args.device, dtype, rep, info, timer=args.timer)
        picks[head_dim] = print_table(head_dim, rows, skipped)
        all_rows += rows
    if args.device == "cuda":
        common.finish(all_rows, "attention", args.quick, "tflops", "TFLOP/s", baseline="sdpa")
    print("\nfastest per head_dim: " + ", ".join(f"{d}: {p}" for d, p in picks.items()))
    return picks


if __name__ == "__main__":
    main(sys.argv[1:])
