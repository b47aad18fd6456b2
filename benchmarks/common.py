"""Shared by the kernel benchmarks: timing, peak memory, the device's copy bandwidth, CSV and plot.

Every number is taken in the same run on the same device. Kernel times are p20/p50/p80 of the
device time per call, from calls replayed out of a CUDA graph (``graph_time_ms``): the GPU's work
alone, without the host's launch overhead, which for calls of tenths of a millisecond (the norm
kernels, and torch.compile's runtime wrappers) is often longer than the kernels and would make a
benchmark of the CPU; where a call cannot be captured, ``triton.testing.do_bench`` times each call
with events (L2 flushed before each; host overhead included) and the row says ``timer="events"``.
Bandwidths count bytes read plus bytes written, and the reference bandwidth is a large
device-to-device copy measured with events (one copy of 4 GiB of traffic: launch cost is nothing).
CPU tensors (the dry run of benchmarks/gpu_report.py) are timed with a wall clock instead and have
no peak-memory reading: the code path is exercised, the numbers mean nothing.
"""

import argparse
import csv
import dataclasses
import functools
import os
import re
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the references live in tests/kernels/, imported as tests.kernels.*
    sys.path.insert(0, ROOT)

RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")
QUANTILES = [0.2, 0.5, 0.8]
MODES = ("forward", "backward", "full")
MIB = 2**20


@dataclasses.dataclass
class Row:
    """One CSV row: one provider, mode and shape."""

    kernel: str
    provider: str
    mode: str
    shape: str
    dtype: str
    ms_p20: float
    ms_p50: float
    ms_p80: float
    gbps: Optional[float]             # effective GB/s: the bytes counted in the script / p50 time
    frac_of_copy_bw: Optional[float]  # gbps / the measured device-to-device copy bandwidth
    tflops: Optional[float]           # for compute-bound kernels (attention)
    baseline: str                     # the provider the speedup is measured against
    speedup: Optional[float]          # baseline p50 / this p50, same mode, shape and dtype
    peak_mem_mib: Optional[float]     # allocated during one call beyond what was allocated before it (CUDA)
    gpu: str
    torch_version: str
    triton_version: str
    timer: str = "events"             # "graph": device time, calls replayed from a CUDA graph; "events": each call
    #                                   timed with events, host launch overhead included; "wall": the CPU's clock


class Deadline:
    """A wall-clock budget for a search: ``passed()`` once ``seconds`` have gone by (None: never)."""

    def __init__(self, seconds: Optional[float]):
        self.end = None if not seconds else time.monotonic() + seconds

    def passed(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def remaining(self) -> float:
        return float("inf") if self.end is None else max(0.0, self.end - time.monotonic())


def largest_fitting(fits: Callable[[int], bool], start: int, limit: int,
                    out_of_time: Callable[[], bool] = lambda: False) -> Optional[int]:
    """Largest ``k`` in ``[start, limit]`` with ``fits(k)``, for ``fits`` true up to a threshold and
    false beyond: double from ``start`` until a probe fails (or ``limit``), then bisect the last
    gap. None when ``start`` does not fit. Costs about 2 log2(answer / start) probes.

    ``out_of_time()`` is asked before each probe after the first; once it is true the search stops
    and returns the largest ``k`` known to fit (a lower bound: callers say so)."""
    if not fits(start):
        return None
    good = start
    bad = None
    while bad is None and good < limit and not out_of_time():
        probe = min(2 * good, limit)
        if fits(probe):
            good = probe
        else:
            bad = probe
    if bad is None:
        return good
    while bad - good > 1 and not out_of_time():
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def git_commit() -> str:
    """$GPU_REPORT_COMMIT when set (the GPU machine's copy of the tree may carry a stale .git or none,
    so the commit the copy was made from is named by whoever copied it); else the checkout's short
    commit, with "+dirty" when tracked files differ from it; "unknown" without git."""
    named = os.environ.get("GPU_REPORT_COMMIT", "").strip()
    if named:
        return named
    if not os.path.exists(os.path.join(ROOT, ".git")):
        return "unknown"
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "diff-index", "--quiet", "HEAD", "--"], cwd=ROOT, timeout=10).returncode != 0
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def require_cuda() -> None:
    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU: torch.cuda.is_available() is False")


def versions() -> Tuple[str, str, str]:
    """(GPU name, torch version, triton version)."""
    import triton

    return torch.cuda.get_device_name(), torch.__version__, triton.__version__


def time_ms(fn: Callable[[], object], grad_to_none: Sequence[torch.Tensor] = (), rep: int = 100,
            device: str = "cuda") -> List[float]:
    """[p20, p50, p80] milliseconds of ``fn`` (on the CPU: wall clock over a few calls)."""
    if device != "cuda":
        return cpu_time_ms(fn, grad_to_none)
    import triton.testing

    return triton.testing.do_bench(fn, rep=rep, quantiles=QUANTILES, grad_to_none=list(grad_to_none) or None)


def graph_time_ms(fn: Callable[[], object], grad_to_none: Sequence[torch.Tensor] = (), rep: int = 20) -> List[float]:
    """[p20, p50, p80] device milliseconds per call of ``fn``, from a CUDA graph of as many calls as take
    about ``rep`` ms (at most 200), replayed 10 times. The inputs' gradients are reset before each
    call. Raises what the capture raises (the caller falls back to ``time_ms``)."""

    def call():
        for t in grad_to_none:
            t.grad = None
        fn()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture will run
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        call()
    end.record()
    torch.cuda.synchronize()
    calls = max(1, min(200, int(rep / max(start.elapsed_time(end) / 5, 1e-3))))  # host-bound estimate: fewer calls
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    for t in grad_to_none:
        t.grad = None
    times.sort()
    return [times[min(len(times) - 1, int(q * len(times)))] for q in QUANTILES]


def timed_ms(fn: Callable[[], object], grad_to_none: Sequence[torch.Tensor] = (), rep: int = 100,
             device: str = "cuda", timer: str = "graph") -> Tuple[List[float], str]:
    """(``[p20, p50, p80]`` ms, the timer used): ``graph_time_ms`` on CUDA when ``timer`` is "graph"
    and the calls can be captured, else ``time_ms`` ("events"; "wall" on the CPU)."""
    if device != "cuda":
        return time_ms(fn, grad_to_none, rep, device), "wall"
    if timer == "graph":
        try:
            return graph_time_ms(fn, grad_to_none, rep=min(rep, 20)), "graph"
        except Exception as error:  # noqa: BLE001 (a call that cannot be captured is timed the other way)
            print(f"CUDA graph capture failed ({type(error).__name__}: {str(error)[:200]}); timing with events",
                  flush=True)
            torch.cuda.synchronize()
            for t in grad_to_none:
                t.grad = None
    return time_ms(fn, grad_to_none, rep, device), "events"


def cpu_time_ms(fn: Callable[[], object], grad_to_none: Sequence[torch.Tensor] = (), calls: int = 3) -> List[float]:
    """[p20, p50, p80] wall-clock milliseconds of ``calls`` calls of ``fn`` after one warm-up call."""
    times = []
    for i in range(calls + 1):
        for t in grad_to_none:
            t.grad = None
        start = time.perf_counter()
        fn()
        if i:
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return [times[min(len(times) - 1, int(q * len(times)))] for q in QUANTILES]


def peak_memory_mib(fn: Callable[[], object]) -> Optional[float]:
    """MiB allocated at the peak of one call of ``fn`` beyond what was allocated before it (None
    without CUDA's allocator statistics)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / MIB


def copy_bandwidth_gbps(nbytes: int = 2 * 2**30, rep: int = 200, device: str = "cuda") -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written), from a copy of
    ``nbytes`` (default 2 GiB, far beyond any L2) timed at its median."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(functools.partial(dst.copy_, src), rep=rep, device=device)[1]
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def modes_for(fn: Callable[[], torch.Tensor], dy: torch.Tensor) -> Dict[str, Callable[[], object]]:
    """The callables timed for forward, backward and full (forward + backward) of ``fn``; an ``fn``
    returning several tensors gets ``dy`` as the gradient of each."""

    def backward_of(out, retain_graph=False):
        outs = out if isinstance(out, (tuple, list)) else (out,)
        torch.autograd.backward(outs, [dy] * len(outs), retain_graph=retain_graph)

    out = fn()

    def backward():
        backward_of(out, retain_graph=True)

    def full():
        backward_of(fn())

    return {"forward": fn, "backward": backward, "full": full}


def bench_providers(kernel: str, label: str, fns: Dict[str, Callable[..., torch.Tensor]],
                    inputs: Sequence[torch.Tensor], dy: torch.Tensor, info: Tuple[str, str, str], rep: int,
                    bytes_moved: Optional[Dict[str, int]] = None, copy_gbps: Optional[float] = None,
                    flops: Optional[Dict[str, float]] = None, timer: str = "graph") -> List[Row]:
    """Time forward, backward and full of each provider ``fns[name](*inputs)`` on one shape.

    ``bytes_moved[mode]`` (with ``copy_gbps``) gives the GB/s columns of memory-bound kernels,
    ``flops[mode]`` the TFLOP/s column of compute-bound ones. The inputs' gradients are reset
    before each timed call. ``timer``: "graph" (device time, see ``timed_ms``) or "events".
    """
    rows = []
    device = dy.device.type
    for provider, fn in fns.items():
        calls = modes_for(lambda: fn(*inputs), dy)
        for mode, call in calls.items():
            (p20, p50, p80), used = timed_ms(call, grad_to_none=inputs, rep=rep, device=device, timer=timer)
            seconds = p50 * 1e-3
            gbps = bytes_moved[mode] / seconds / 1e9 if bytes_moved else None
            rows.append(Row(
                kernel=kernel, provider=provider, mode=mode, shape=label, dtype=str(dy.dtype).replace("torch.", ""),
                ms_p20=p20, ms_p50=p50, ms_p80=p80, gbps=gbps,
                frac_of_copy_bw=gbps / copy_gbps if gbps and copy_gbps else None,
                tflops=flops[mode] / seconds / 1e12 if flops else None, baseline="", speedup=None,
                peak_mem_mib=peak_memory_mib(call) if device == "cuda" else None, gpu=info[0],
                torch_version=info[1], triton_version=info[2], timer=used,
            ))
        del calls  # frees the retained graph before the next provider
        for t in inputs:
            t.grad = None
    return rows


def fill_speedups(rows: List[Row], baseline: str) -> None:
    """Set ``speedup`` of every row from the baseline provider's p50 at the same mode, shape and dtype."""
    base = {(r.mode, r.shape, r.dtype): r.ms_p50 for r in rows if r.provider == baseline}
    for r in rows:
        ref = base.get((r.mode, r.shape, r.dtype))
        r.baseline, r.speedup = baseline, (None if ref is None else ref / r.ms_p50)


def base_parser(doc: str) -> argparse.ArgumentParser:
    """--quick, --dtype and --rep, shared by the benchmarks; the script's docstring is its help."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two small shapes and short timings (a smoke run)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--rep", type=int, default=100, help="milliseconds of timed repetitions per measurement")
    parser.add_argument("--timer", choices=("graph", "events"), default="graph",
                        help="graph: device time of calls replayed from a CUDA graph (default); events: each call "
                             "timed with CUDA events, the host's launch overhead included")
    return parser


def setup(args: argparse.Namespace,
          measure_copy: bool = True) -> Tuple[torch.dtype, int, Tuple[str, str, str], Optional[float]]:
    """(dtype, rep, (gpu, torch, triton), copy GB/s or None) for parsed ``base_parser`` arguments;
    exits without a GPU."""
    require_cuda()
    info = versions()
    copy_gbps = copy_bandwidth_gbps() if measure_copy else None
    copy = f"device-to-device copy {copy_gbps:.0f} GB/s (read + write); " if copy_gbps else ""
    print(f"{info[0]}: {copy}torch {info[1]}, triton {info[2]}")
    return getattr(torch, args.dtype), (20 if args.quick else args.rep), info, copy_gbps


def finish(rows: List[Row], kernel: str, quick: bool, metric: str, ylabel: str, baseline: str = "eager",
           reference: Optional[float] = None, reference_label: str = "") -> None:
    """Speedups over ``baseline``, a printed table, the CSV and the plot under benchmarks/results/."""
    fill_speedups(rows, baseline)
    print_rows(rows)
    name = result_name(kernel + ("_quick" if quick else ""), rows[0].gpu)
    print("wrote", write_csv(rows, name))
    print("wrote", plot(rows, name, metric, ylabel, reference, reference_label))


def write_csv(rows: List[Row], name: str) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[field.name for field in dataclasses.fields(Row)])
        writer.writeheader()
        for row in rows:
            values = dataclasses.asdict(row).items()
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in values})
    return path


def plot(rows: List[Row], name: str, metric: str, ylabel: str, reference: Optional[float] = None,
         reference_label: str = "") -> str:
    """One panel per mode: ``metric`` per shape (x axis) for each provider; optional horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r.shape for r in rows))
    providers = list(dict.fromkeys(r.provider for r in rows))
    fig, axes = plt.subplots(1, len(MODES), figsize=(6 * len(MODES), 4.5), sharey=True)
    for ax, mode in zip(axes, MODES):
        for provider in providers:
            values = {r.shape: getattr(r, metric) for r in rows if r.mode == mode and r.provider == provider}
            ax.plot(range(len(shapes)), [values.get(s) for s in shapes], marker="o", label=provider)
        if reference is not None:
            ax.axhline(reference, color="gray", linestyle="--", label=reference_label)
        ax.set_title(mode)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=60, ha="right", fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[-1].legend(fontsize=8)
    gpu = rows[0].gpu if rows else ""
    fig.suptitle(f"{name} on {gpu}")
    fig.tight_layout()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def result_name(kernel: str, gpu: str) -> str:
    """``<kernel>_<gpu>`` with the GPU name made file-safe, e.g. fused_adaln_NVIDIA_H100_80GB_HBM3."""
    return f"{kernel}_{re.sub(r'[^A-Za-z0-9]+', '_', gpu).strip('_')}"


def print_rows(rows: List[Row]) -> None:
    header = (f"{'provider':<10} {'mode':<9} {'shape':<24} {'p50 ms':>9} {'GB/s':>8} {'copy%':>6} {'TFLOP/s':>8} "
              f"{'speedup':>7} {'MiB':>9}")
    print(header)
    for r in rows:
        fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
        print(f"{r.provider:<10} {r.mode:<9} {r.shape:<24} {r.ms_p50:>9.4f} {fmt(r.gbps, '8.0f'):>8} "
              f"{fmt(None if r.frac_of_copy_bw is None else 100 * r.frac_of_copy_bw, '6.1f'):>6} "
              f"{fmt(r.tflops, '8.1f'):>8} {fmt(r.speedup, '7.2f'):>7} {fmt(r.peak_mem_mib, '9.1f'):>9}")
