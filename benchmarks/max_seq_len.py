"""Maximum trainable tokens per GPU with activation checkpointing and CPU offload of activations.

For one registered model, a search finds the largest training step that fits in GPU memory, in
bf16, in each mode:

    none     no activation checkpointing
    full     every block checkpointed (selective_ratio 0)
    offload  every block checkpointed and its inputs offloaded to pinned CPU memory

What is searched (``--search``):

    batch    (default) the batch at a fixed input size (``--size``; DiT: 256 px, 256 tokens per
             image), so tokens per GPU = batch x tokens per sample. A probe is one step whose
             time grows linearly with the batch, so the search stays short even for DiT-XL/2.
    size     the input size at batch 1 (resolution for image models, frames for video models).
             Attention makes a step quadratic in the tokens: probes near the maximum of a large
             model are multi-minute steps.

The search doubles from the smallest value until a probe runs out of memory, then bisects; each
probe is a single step (it allocates the optimizer state too, so it decides whether the step
fits). Then every mode is timed at every mode's maximum where it fits (``--steps`` steps, median),
so that offload's cost is read where checkpointing alone stops (target: offload reaches >= 1.4x
the tokens of checkpointing alone at <= 15% more step time).

``--time-budget`` bounds the whole run (default 540 s): 70% of it goes to the searches, shared
equally by the modes, the rest to timing. A search that runs out reports the largest value known
to fit and marks it as a lower bound; timings that do not fit in the budget are skipped and said so.

A step is forward, backward and a fused AdamW step under bf16 autocast with fp32 weights
(weights + gradients + two Adam moments: 16 bytes per parameter), the memory layout of
single-GPU mixed-precision training.

One GPU, from the project root:

    python benchmarks/max_seq_len.py --model DiT-XL/2
    python benchmarks/max_seq_len.py --model DiT-XL/2 --search size --modes full offload --max-size 8192

Writes benchmarks/results/max_seq_len_<model>_<gpu>.csv (one row per measurement) and .png.

Model families plug in with ``register_input_builder``: a function building the model and an
input of a given size and batch (see ``build_dit``). DiT is built in; video families register
theirs with unit "frames".
"""

import argparse
import csv
import gc
import math
import os
import re
import statistics
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from common import Deadline, largest_fitting  # benchmarks/common.py
from flops import device_peak_tflops, dit_forward_flops, train_flops  # benchmarks/flops.py

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.models import build_model

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# mode -> apply_activation_checkpointing arguments (None: leave the model as it is)
MODES: Dict[str, Optional[dict]] = {
    "none": None,
    "full": dict(selective_ratio=0.0, offload=False),
    "offload": dict(selective_ratio=0.0, offload=True),
}

# ----------------------------------------------------------------------------------------------
# Model families: how to build a model and an input of a given size and batch
# ----------------------------------------------------------------------------------------------

@dataclass
class Trial:
    model: nn.Module
    inputs: tuple   # positional arguments of model.forward
    tokens: int     # tokens the transformer blocks see per GPU (the whole batch, no sequence parallelism)
    flops: float    # model FLOPs of one training step (forward + backward, no recomputation)


@dataclass(frozen=True)
class InputBuilder:
    unit: str                                 # what the searched size counts: "resolution" (px) or "frames"
    granularity: Callable[[str], int]         # model name -> sizes are multiples of this
    default_range: Tuple[int, int]            # (smallest, largest) size searched unless given
    default_size: int                         # the fixed size of a batch search unless given
    build: Callable[[str, int, int], Trial]   # (model name, size, batch) -> trial, on the current default device


INPUT_BUILDERS: Dict[str, InputBuilder] = {}


def register_input_builder(family: str, unit: str, granularity: Callable[[str], int],
                           default_range: Tuple[int, int], default_size: int):
    """Register ``build(name, size, batch) -> Trial`` for the models named ``<family>-...``."""

    def wrap(build: Callable[[str, int, int], Trial]) -> Callable[[str, int, int], Trial]:
        if family in INPUT_BUILDERS:
            raise ValueError(f"an input builder for model family {family!r} is already registered")
        INPUT_BUILDERS[family] = InputBuilder(unit, granularity, default_range, default_size, build)
        return build

    return wrap


def input_builder_for(model_name: str) -> InputBuilder:
    family = model_name.split("-", 1)[0]
    if family not in INPUT_BUILDERS:
        raise KeyError(f"no input builder for model {model_name!r} (family {family!r}); known families: "
                       f"{', '.join(sorted(INPUT_BUILDERS))}. Register one with register_input_builder.")
    return INPUT_BUILDERS[family]


VAE_DOWNSAMPLE = 8  # the SD VAE maps 8x8 pixels to one latent pixel


def _dit_patch(name: str) -> int:
    return int(name.rsplit("/", 1)[1])  # "DiT-XL/2" -> 2


@register_input_builder("DiT", unit="resolution", granularity=lambda name: VAE_DOWNSAMPLE * _dit_patch(name),
                        default_range=(256, 16384), default_size=256)
def build_dit(name: str, resolution: int, batch: int = 1) -> Trial:
    latent = resolution // VAE_DOWNSAMPLE
    model = build_model(name, input_size=latent)
    x = torch.randn(batch, model.in_channels, latent, latent)   # [B, C, H, W] latents
    t = torch.randint(0, 1000, (batch,))                         # [B] timesteps
    y = torch.zeros(batch, dtype=torch.long)                     # [B] class labels
    tokens = batch * (latent // model.patch_size) ** 2
    return Trial(model, (x, t, y), tokens, batch * train_flops(dit_forward_flops(model)))


# ----------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------

@dataclass
class Measurement:
    tokens: int
    step_ms: float      # median over the timed steps (nan when only probed)
    peak_bytes: int
    flops: float


def _measure(builder: InputBuilder, name: str, size: int, batch: int, mode: str, device: torch.device,
             timed_steps: int) -> Measurement:
    with torch.device(device):
        trial = builder.build(name, size, batch)
    model = trial.model.train()
    if MODES[mode] is not None:
        apply_activation_checkpointing(model, **MODES[mode])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(*trial.inputs)
        out.float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats(device)
    step()  # warm-up; also allocates the optimizer state, so one step decides whether it fits
    times = []
    for _ in range(timed_steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    torch.cuda.synchronize(device)
    return Measurement(trial.tokens, statistics.median(times) if times else math.nan,
                       torch.cuda.max_memory_allocated(device), trial.flops)


def measure(builder: InputBuilder, name: str, size: int, batch: int, mode: str, device: torch.device,
            timed_steps: int) -> Optional[Measurement]:
    """One size and batch in one mode; None when it runs out of GPU memory."""
    try:
        return _measure(builder, name, size, batch, mode, device, timed_steps)
    except torch.cuda.OutOfMemoryError:
        return None
    except RuntimeError as error:  # libraries' workspace allocations fail with their own errors
        if "CUBLAS_STATUS_ALLOC_FAILED" in str(error) or "out of memory" in str(error):
            return None
        raise
    finally:
        gc.collect()  # the model, optimizer and activations of this trial, also after an OOM
        torch.cuda.empty_cache()


# The share of --time-budget spent searching; the rest times the maxima.
SEARCH_SHARE = 0.7


def run(model_name: str, modes: Sequence[str], search: str, size_range: Tuple[int, int], size: int,
        max_batch: int, timed_steps: int, device: torch.device, time_budget: Optional[float] = None,
        on_row: Optional[Callable[[dict], None]] = None) -> List[dict]:
    """Search each mode's maximum (``search``: "batch" at ``size``, or "size" in ``size_range`` at
    batch 1), then time every mode at every maximum it fits, within ``time_budget`` seconds.

    ``on_row``: called with each result as soon as it is known, a search's maximum first
    (``kind`` "max": mode, size, batch, tokens, lower bound) then every timed row (``kind``
    "timed", as returned), so that a caller cut short keeps what was found."""
    on_row = on_row or (lambda row: None)
    builder = input_builder_for(model_name)
    grain = builder.granularity(model_name)
    gpu = torch.cuda.get_device_name(device)
    peak = device_peak_tflops(gpu)
    total = Deadline(time_budget)
    searching = Deadline(None if not time_budget else SEARCH_SHARE * time_budget)

    def point(k: int) -> Tuple[int, int]:  # searched value -> (size, batch)
        return (size, k) if search == "batch" else (k * grain, 1)

    if search == "batch":
        lo, hi = 1, max_batch
    else:
        lo, hi = -(-size_range[0] // grain), size_range[1] // grain  # search k, size = k * grain
    maxima: Dict[str, Optional[Tuple[int, int]]] = {}
    fitted_tokens: Dict[Tuple[int, int], int] = {}  # (size, batch) -> tokens of each probe that fitted
    lower_bound: Dict[str, bool] = {}
    for index, mode in enumerate(modes):
        share = Deadline(None if not time_budget else searching.remaining() / (len(modes) - index))

        def fits(k: int, mode=mode) -> bool:
            s, b = point(k)
            m = measure(builder, model_name, s, b, mode, device, timed_steps=0)
            ok = m is not None
            if ok:
                fitted_tokens[(s, b)] = m.tokens
            print(f"  {mode:8s} {builder.unit} {s} batch {b}: {'fits' if ok else 'out of memory'}", flush=True)
            return ok

        k = largest_fitting(fits, lo, hi, out_of_time=share.passed)
        maxima[mode] = None if k is None else point(k)
        lower_bound[mode] = k is not None and share.passed()
        s_max, b_max = maxima[mode] or (None, None)
        on_row(dict(kind="max", model=model_name, mode=mode, unit=builder.unit, size=s_max, batch=b_max,
                    tokens=fitted_tokens.get(maxima[mode]), max_is_lower_bound=lower_bound[mode]))
        note = " (time budget spent: a lower bound)" if lower_bound[mode] else ""
        print(f"{mode}: largest {search} {None if k is None else (k if search == 'batch' else k * grain)}{note}",
              flush=True)

    rows = []
    points = sorted({p for p in maxima.values() if p is not None}, key=lambda p: (p[1], p[0]))
    for mode in modes:
        for s, b in points:
            if maxima[mode] is None or (b, s) > (maxima[mode][1], maxima[mode][0]):
                continue
            if total.passed():
                print(f"  {mode} at {builder.unit} {s} batch {b}: not timed, --time-budget spent", flush=True)
                continue
            m = measure(builder, model_name, s, b, mode, device, timed_steps)
            if m is None:  # fitted while probing, not now (fragmentation): report, do not guess
                print(f"  {mode} at {builder.unit} {s} batch {b}: out of memory when timed", flush=True)
                continue
            tflops = m.flops / (m.step_ms * 1e-3) / 1e12
            rows.append(dict(kind="timed", model=model_name, mode=mode, unit=builder.unit, size=s, batch=b,
                             tokens=m.tokens,
                             is_max=(s, b) == maxima[mode], max_is_lower_bound=lower_bound[mode],
                             step_ms=round(m.step_ms, 2), tflops=round(tflops, 1),
                             mfu=round(tflops / peak, 4) if peak else "",
                             peak_gib=round(m.peak_bytes / 2 ** 30, 2), device=gpu, torch=torch.__version__))
            on_row(rows[-1])
            print(f"  {mode:8s} {builder.unit} {s} batch {b} ({m.tokens} tokens): {m.step_ms:.1f} ms/step, "
                  f"{tflops:.0f} TFLOP/s, peak {m.peak_bytes / 2 ** 30:.1f} GiB", flush=True)
    return rows


def summarize(rows: List[dict]) -> str:
    best = {r["mode"]: r for r in rows if r["is_max"]}
    lines = [f"{mode:8s} max {r['tokens']} tokens ({r['unit']} {r['size']}, batch {r['batch']})"
             f"{' or more (time budget spent)' if r['max_is_lower_bound'] else ''}, {r['step_ms']} ms/step"
             for mode, r in best.items()]
    if "full" in best and "offload" in best:
        gain = best["offload"]["tokens"] / best["full"]["tokens"]
        at = {r["mode"]: r["step_ms"] for r in rows
              if (r["size"], r["batch"]) == (best["full"]["size"], best["full"]["batch"])}
        overhead = at["offload"] / at["full"] - 1 if "offload" in at else math.nan
        lines.append(f"offload vs full checkpointing: {gain:.2f}x tokens, {overhead:+.1%} step time at "
                     f"{best['full']['tokens']} tokens")
    return "\n".join(lines)


def write_results(rows: List[dict], out_dir: str, model_name: str) -> Tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", f"{model_name}_{rows[0]['device']}").strip("_")
    csv_path = os.path.join(out_dir, f"max_seq_len_{slug}.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    # a mode that fitted at its maximum while probing but not when timed has no maximum row: 0
    maxima = [next((r["tokens"] for r in rows if r["mode"] == m and r["is_max"]), 0) for m in modes]
    bars = left.bar(modes, [t / 1e3 for t in maxima])
    left.bar_label(bars, labels=[f"{t / 1e3:.0f}k" for t in maxima])
    left.set_ylabel("max tokens per GPU (thousands)")
    left.set_title("largest trainable step (bf16)")
    for mode in modes:
        points = sorted((r["tokens"], r["step_ms"]) for r in rows if r["mode"] == mode)
        right.plot([p[0] / 1e3 for p in points], [p[1] / 1e3 for p in points], marker="o", label=mode)
    right.set_xlabel("tokens per GPU (thousands)")
    right.set_ylabel("step time (s)")
    right.set_title("step time")
    right.legend()
    fig.suptitle(f"{model_name} on {rows[0]['device']}")
    fig.tight_layout()
    png_path = csv_path[:-4] + ".png"
    fig.savefig(png_path, dpi=120)
    return csv_path, png_path


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="registered model name, e.g. DiT-XL/2")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                        help="none: no checkpointing; full: every block checkpointed; "
                             "offload: full + block inputs in pinned CPU memory")
    parser.add_argument("--search", choices=("batch", "size"), default="batch",
                        help="batch: the batch at a fixed --size (default); size: the input size at batch 1")
    parser.add_argument("--size", type=int, help="input size of a batch search (the family's unit; DiT: 256 px)")
    parser.add_argument("--max-batch", type=int, default=8192, help="largest batch a batch search tries")
    parser.add_argument("--min-size", type=int, help="smallest size of a size search (the family's unit)")
    parser.add_argument("--max-size", type=int, help="largest size of a size search (the family's unit)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per measurement (median reported)")
    parser.add_argument("--time-budget", type=float, default=540.0,
                        help="seconds for the whole run (70%% searching, 30%% timing); 0: no limit")
    parser.add_argument("--out-dir", default=RESULTS_DIR, help="where the CSV and PNG go")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        raise SystemExit("error: this benchmark measures GPU memory and needs a CUDA device; none is visible.")
    builder = input_builder_for(args.model)
    size_range = (args.min_size or builder.default_range[0], args.max_size or builder.default_range[1])
    size = args.size or builder.default_size
    rows = run(args.model, args.modes, args.search, size_range, size, args.max_batch, args.steps,
               torch.device("cuda", torch.cuda.current_device()), time_budget=args.time_budget or None)
    if not rows:
        smallest = f"batch 1 at {builder.unit} {size}" if args.search == "batch" else f"{builder.unit} {size_range[0]}"
        raise SystemExit(f"error: {args.model} does not fit at {smallest} in any mode.")
    print(summarize(rows))
    for path in write_results(rows, args.out_dir, args.model):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
