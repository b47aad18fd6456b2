"""End-to-end training-step benchmark: throughput, MFU and peak memory of opendit_lite's
configurations against plain PyTorch baselines, all measured in the same run.

One GPU, from the project root (DiT-XL/2 at 256 px):

    python benchmarks/train_step.py --batch-size 128                # every default configuration, ~10 min
    python benchmarks/train_step.py --batch-search --configs torch-bf16-compile zero0+kernels+compile \
        --search-budget 240                                          # each at its largest batch, < 10 min
    python benchmarks/train_step.py --batch-size 128 --precision fp8 --configs torch-bf16-compile zero0+kernels+compile
    python benchmarks/train_step.py --profile zero0+kernels+compile --batch-size 256

Several GPUs of one node (throughput is summed over ranks; MFU is per GPU; no --batch-search):

    torchrun --standalone --nproc_per_node 8 benchmarks/train_step.py --batch-size 256

A smoke run on the CPU (tiny model, no timing meaning):

    python benchmarks/train_step.py --model DiT-T/2 --image-size 64 --device cpu --precision fp32 \\
        --batch-size 2 --warmup-steps 2 --steps 2 --configs torch-fp32 zero0

Configurations (``--configs``):

    torch-fp32          the plain loop of Meta's DiT train.py: fp32 weights and compute with TF32
                        matmuls, torch AdamW (lr 1e-4, weight decay 0), a full fp32 EMA replica
                        updated parameter by parameter after every step, DDP
    torch-bf16-compile  the same loop under bf16 autocast with the DDP model torch.compile'd
    zero<D>[+kernels][+compile][+ac[<ratio>]][+offload]
                        OpenDiTPlugin at zero_degree D (0 DDP, 1/2 ZeRO, 3 Gemini) in --precision
                        (fp8: bf16 with the blocks' Linear layers in float8 through torchao, on GPUs
                        of compute capability >= 8.9; refused elsewhere with exit code 2),
                        with its sharded EMA, set up by ``opendit_lite.parallelization.parallelize``: +kernels: the
                        fused AdaLN Triton kernel and flash attention when installed (DiT has no
                        affine LayerNorm for the fused LayerNorm); +compile: torch.compile per
                        block; +ac: activation checkpointing leaving a fraction <ratio> of blocks out
                        (default 0: every block); +offload: checkpointed inputs kept in CPU memory

Every configuration trains the same model from the same initial weights on the same synthetic
latents with the diffusion loss of DiT (1000 steps, learned sigma), with no gradient clipping
(DiT trains without it; ``--grad-clip`` turns it on for the plugin). A step is forward, backward,
optimizer step and EMA update. After ``--warmup-steps`` (compilation, allocator and cuDNN/cuBLAS
warm-up), ``--steps`` steps are timed with CUDA events and one synchronisation at the end.

Reported per configuration: samples/s and tokens/s (all ranks), model TFLOP/s and MFU per GPU
(model FLOPs from ``flops.py``, over the dense bf16 peak of the device or ``--peak-tflops``),
peak allocated memory, and speed-ups over both baselines. ``--batch-search`` finds, per
configuration, the largest per-GPU batch (a multiple of ``--batch-multiple``) whose step fits in
memory: doubling until it runs out of memory, then bisecting, within ``--search-budget`` seconds
for all configurations together (a search cut short keeps the largest batch known to fit and says
so). A configuration is built and compiled once and stepped at every batch it is probed and timed
at (``ConfigRun``): torch.compile's automatic dynamic shapes make the batch dimension symbolic at
the second batch size seen, so a search costs at most two compilations per graph, the rebuild after
an out-of-memory probe included. Compiling DiT-XL/2 takes a minute or two per configuration on an
H100, so search two or three configurations per 10-minute run.

Writes under ``--out-dir`` (default benchmarks/results/): train_step_<model>_<device>.csv and .md
(a table for the README), rewritten after every configuration so that a run cut short keeps the
rows measured so far, and at the end a .png bar chart, each stamped with device, date and commit;
``--profile CONFIG`` also writes train_step_profile_<config>_<model>_<device>.md, the kernels that
took the most device time in a few profiled steps of that configuration.

Model families plug in with ``register_workload`` (see ``dit_workload``).
"""

import argparse
import copy
import csv
import dataclasses
import datetime
import gc
import os
import platform
import re
import statistics
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

import common  # benchmarks/common.py: RESULTS_DIR, result_name, the bounded batch search
import torch
import torch.distributed as dist
import torch.nn as nn
from common import largest_fitting
from flops import device_peak_tflops, dit_forward_flops, mfu, train_flops

BASELINES = ("torch-fp32", "torch-bf16-compile")
DEFAULT_CONFIGS = BASELINES + (
    "zero0", "zero1", "zero2", "zero3",
    "zero0+kernels", "zero0+compile", "zero0+kernels+compile", "zero0+kernels+compile+ac",
)
LR, WEIGHT_DECAY, EMA_DECAY = 1e-4, 0.0, 0.9999  # DiT's recipe
VAE_DOWNSAMPLE = 8  # the SD VAE maps 8 x 8 pixels to one latent pixel
GIB = 2**30


# ----------------------------------------------------------------------------------------------
# Workloads: a model family's model, synthetic batch, loss and FLOPs
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Workload:
    """What the benchmark trains. ``build_model`` is called once per configuration (same seed)."""

    build_model: Callable[[], nn.Module]
    make_batch: Callable[[int, torch.device], dict]          # (batch size, device) -> batch
    loss: Callable[[nn.Module, dict], torch.Tensor]           # (model as called, batch) -> scalar loss
    tokens_per_sample: Callable[[nn.Module], int]             # tokens the transformer blocks see
    forward_flops_per_sample: Callable[[nn.Module], float]   # model FLOPs of one forward (flops.py)


WORKLOADS: Dict[str, Callable[..., Workload]] = {}


def register_workload(family: str) -> Callable:
    """Register ``factory(model_name, image_size, num_classes) -> Workload`` for models ``<family>-...``."""

    def wrap(factory: Callable[..., Workload]) -> Callable[..., Workload]:
        if family in WORKLOADS:
            raise ValueError(f"a workload for model family {family!r} is already registered")
        WORKLOADS[family] = factory
        return factory

    return wrap


def build_workload(model_name: str, image_size: int, num_classes: int) -> Workload:
    family = model_name.split("-", 1)[0]
    if family not in WORKLOADS:
        raise SystemExit(f"error: no workload for model {model_name!r} (family {family!r}); known families: "
                         f"{', '.join(sorted(WORKLOADS))}. Register one with register_workload in {__file__}.")
    return WORKLOADS[family](model_name, image_size, num_classes)


@register_workload("DiT")
def dit_workload(model_name: str, image_size: int, num_classes: int) -> Workload:
    """Class-conditional DiT on SD-VAE latents (image_size / 8 square), trained with DiT's diffusion loss."""
    from opendit_lite.diffusion import create_diffusion
    from opendit_lite.models import build_model

    if image_size % VAE_DOWNSAMPLE:
        raise SystemExit(f"error: --image-size {image_size} must be a multiple of {VAE_DOWNSAMPLE} "
                         f"(the VAE's downsampling)")
    latent = image_size // VAE_DOWNSAMPLE
    diffusion = create_diffusion(timestep_respacing="")  # 1000 steps, linear betas, learned sigma

    def make_batch(batch_size: int, device: torch.device) -> dict:
        x = torch.randn(batch_size, 4, latent, latent, device=device)           # [B, 4, H/8, W/8] latents
        y = torch.randint(0, num_classes, (batch_size,), device=device)          # [B] class labels
        return dict(x=x, y=y)

    def loss(model: nn.Module, batch: dict) -> torch.Tensor:
        x = batch["x"]
        t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],), device=x.device)  # [B]
        return diffusion.training_losses(model, x, t, model_kwargs=dict(y=batch["y"]))["loss"].mean()

    return Workload(
        build_model=lambda: build_model(model_name, input_size=latent, num_classes=num_classes),
        make_batch=make_batch,
        loss=loss,
        tokens_per_sample=lambda model: model.x_embedder.num_patches,
        forward_flops_per_sample=dit_forward_flops,
    )


# ----------------------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One configuration, parsed from its name (see the module docstring)."""

    name: str
    baseline: bool                       # the plain PyTorch loop instead of the plugin
    precision: str                       # "fp32", "bf16", "fp16" or "fp8"
    zero_degree: Optional[int] = None    # plugin only
    kernels: bool = False
    compile: bool = False
    selective_ratio: Optional[float] = None  # None: no activation checkpointing
    offload: bool = False


def parse_config(name: str, precision: str) -> BenchConfig:
    """``torch-fp32`` | ``torch-bf16-compile`` | ``zero<D>[+kernels][+compile][+ac[<ratio>]][+offload]``."""
    if name == "torch-fp32":
        return BenchConfig(name, baseline=True, precision="fp32")
    if name == "torch-bf16-compile":
        return BenchConfig(name, baseline=True, precision="bf16", compile=True)
    head, *options = name.split("+")
    match = re.fullmatch(r"zero([0-3])", head)
    if match is None:
        raise ValueError(f"unknown configuration {name!r}: use {' or '.join(BASELINES)} or "
                         "zero<0-3>[+kernels][+compile][+ac[<ratio>]][+offload], e.g. zero2+kernels+ac0.25")
    fields = dict(zero_degree=int(match.group(1)))
    for option in options:
        ac = re.fullmatch(r"ac([0-9.]*)", option)
        if option in ("kernels", "compile", "offload"):
            fields[option] = True
        elif ac is not None:
            ratio = float(ac.group(1) or 0.0)
            if not 0.0 <= ratio < 1.0:
                raise ValueError(f"{name!r}: +ac<ratio> takes the fraction of blocks NOT checkpointed, in [0, 1)")
            fields["selective_ratio"] = ratio
        else:
            raise ValueError(f"{name!r}: unknown option {option!r}; options are kernels, compile, ac[<ratio>], offload")
    if fields.get("offload") and "selective_ratio" not in fields:
        raise ValueError(f"{name!r}: +offload moves checkpointed blocks' inputs; add +ac")
    return BenchConfig(name, baseline=False, precision=precision, **fields)


# Converter settings for "+kernels": every fused kernel, flash attention when flash-attn imports.
KERNELS_ON = dict(fused_adaln=True, attention_backend="auto")
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


# ----------------------------------------------------------------------------------------------
# Training steps
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Trainer:
    """A built configuration: ``step(batch)`` runs one full training step."""

    model: nn.Module                         # the unwrapped model (for FLOPs and token counts)
    step: Callable[[dict], None]


@torch.no_grad()
def update_ema_per_parameter(ema: nn.Module, model: nn.Module, decay: float) -> None:
    """DiT's EMA: one multiply-add per parameter tensor into a full fp32 replica."""
    ema_params = dict(ema.named_parameters())
    for name, param in model.named_parameters():
        ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def build_baseline(config: BenchConfig, workload: Workload, device: torch.device, compile_backend: str) -> Trainer:
    """The plain PyTorch loop of DiT's train.py (see the module docstring), optionally bf16 + compiled."""
    with device:  # initialised where it trains: no host-side init of a large model, no copy
        model = workload.build_model()
    ema = copy.deepcopy(model).requires_grad_(False)
    wrapped = model
    if dist.is_initialized():
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if config.compile:
        wrapped = torch.compile(wrapped, backend=compile_backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    dtype = AUTOCAST_DTYPES[config.precision]

    def step(batch: dict) -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = workload.loss(wrapped, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        update_ema_per_parameter(ema, model, EMA_DECAY)

    return Trainer(model, step)


def build_plugin_config(config: BenchConfig, workload: Workload, device: torch.device, compile_backend: str,
                        grad_clip: float) -> Trainer:
    """Our stack: OpenDiTPlugin + Booster, with kernels, checkpointing and compile as asked."""
    from colossalai.booster import Booster

    from opendit_lite.parallelization import parallelize
    from opendit_lite.plugins import OpenDiTPlugin

    plugin = OpenDiTPlugin(zero_degree=config.zero_degree, precision=config.precision, grad_clip=grad_clip)
    booster = Booster(plugin=plugin)
    with device:  # initialised where it trains: no host-side init of a large model, no copy
        model = workload.build_model()
    if config.precision == "fp8":  # before the kernels and compile, as train.py does
        from opendit_lite.precision import apply_fp8_training

        apply_fp8_training(model)
    kernels = KERNELS_ON if config.kernels else {}
    ratio = 1.0 if config.selective_ratio is None else config.selective_ratio
    print(parallelize(model, **kernels, selective_ratio=ratio, ac_offload=config.offload, compile=config.compile,
                      compile_backend=compile_backend), flush=True)
    model.to(device)
    optimizer = plugin.build_optimizer(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    boosted, optimizer, *_ = booster.boost(model, optimizer)

    def step(batch: dict) -> None:
        loss = workload.loss(boosted, batch)
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        plugin.update_ema(boosted, optimizer, decay=EMA_DECAY)

    return Trainer(model, step)


def build_trainer(config: BenchConfig, workload: Workload, device: torch.device, args: argparse.Namespace) -> Trainer:
    torch.manual_seed(args.seed)  # same initial weights for every configuration
    if config.baseline:
        return build_baseline(config, workload, device, args.compile_backend)
    return build_plugin_config(config, workload, device, args.compile_backend, args.grad_clip)


# ----------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Measurement:
    step_ms: List[float]
    tokens_per_sample: int
    forward_flops_per_sample: float
    peak_alloc_bytes: Optional[int]     # torch.cuda.max_memory_allocated over warm-up and timed steps
    peak_reserved_bytes: Optional[int]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[dict], None], batch: dict, steps: int, device: torch.device) -> List[float]:
    """Milliseconds of each of ``steps`` steps. On CUDA, events recorded around each step and read
    after one synchronisation at the end, so the host never waits between steps."""
    if device.type != "cuda":
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step(batch)
            times.append((time.perf_counter() - start) * 1e3)
        return times
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        step(batch)
        events[i + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(steps)]


def warm_up(trainer: Trainer, batch: dict, steps: int, device: torch.device) -> None:
    for _ in range(steps):
        trainer.step(batch)
    synchronize(device)


def measure(trainer: Trainer, workload: Workload, batch: dict, warmup_steps: int, steps: int,
            device: torch.device) -> Measurement:
    """Warm-up steps, then timed steps; peak memory covers both (the optimizer state appears in step 1)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    warm_up(trainer, batch, warmup_steps, device)
    times = time_steps(trainer.step, batch, steps, device)
    peaks = (None, None)
    if device.type == "cuda":
        peaks = (torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device))
    return Measurement(times, workload.tokens_per_sample(trainer.model),
                       workload.forward_flops_per_sample(trainer.model), *peaks)


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA OOM, including the libraries' workspace allocations that fail with their own errors."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(
        text in str(error) for text in ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED"))


def release_memory() -> None:
    """Free the previous configuration's model, optimizer and compiled graphs before the next."""
    free_memory()
    torch._dynamo.reset()


def free_memory() -> None:
    """Free what is no longer referenced (an out-of-memory step's activations) and hand the cached
    blocks back, keeping the compiled graphs."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class ConfigRun:
    """One configuration, built once and stepped at whatever batch size it is asked to measure.

    The compiled graphs are reused across batch sizes: torch.compile's automatic dynamic shapes
    recompile once with a symbolic batch dimension at the second batch size seen, and every later
    size reuses that graph, so a batch search costs at most two compilations per graph. After an
    out-of-memory step the trainer is rebuilt for the next batch (a DDP backward cut short leaves
    its reducer unable to step again) while the compiled code is kept: dynamo's cache belongs to
    the blocks' code, not to the model instance. ``close`` frees everything, graphs included."""

    def __init__(self, config: BenchConfig, workload: Workload, device: torch.device, args: argparse.Namespace):
        self.config, self.workload, self.device, self.args = config, workload, device, args
        self.trainer: Optional[Trainer] = None
        self.builds = 0  # how many times the trainer was built (1 + rebuilds after out-of-memory steps)
        self.measured_kernels = False  # the kernel dispatch's eager measuring step ran

    def measure(self, batch_size: int, warmup_steps: int, steps: int) -> Optional[Measurement]:
        """``warmup_steps`` then ``steps`` timed steps at ``batch_size``; None when they do not fit in
        memory. Errors other than out-of-memory propagate."""
        out_of_memory = False
        try:
            if self.trainer is None:
                self.builds += 1
                self.trainer = build_trainer(self.config, self.workload, self.device, self.args)
            batch = self.workload.make_batch(batch_size, self.device)
            if self.config.kernels and self.device.type == "cuda" and not self.measured_kernels:
                # One eager step first, so that the kernel dispatch times each norm signature against
                # torch.compile before the compiled graphs read its choices (kernels/kernel_choice.py).
                from opendit_lite.kernels.kernel_choice import measured_eagerly

                with measured_eagerly():
                    self.trainer.step(batch)
                self.measured_kernels = True
            return measure(self.trainer, self.workload, batch, warmup_steps, steps, self.device)
        except Exception as error:  # noqa: BLE001  (only OOM is handled; everything else re-raised)
            if not is_out_of_memory(error):
                raise
            out_of_memory = True
        finally:
            if out_of_memory:
                self.trainer = None
                free_memory()  # after the except block, once the traceback's frames are gone
        return None

    def close(self) -> None:
        self.trainer = None
        release_memory()


def try_measure(config: BenchConfig, workload: Workload, batch_size: int, warmup_steps: int, steps: int,
                device: torch.device, args: argparse.Namespace) -> Optional[Measurement]:
    """Build the configuration and measure it; None when the batch does not fit in memory. Nothing
    of the configuration outlives the call, so the next one starts from an empty device."""
    run = ConfigRun(config, workload, device, args)
    try:
        return run.measure(batch_size, warmup_steps, steps)
    finally:
        run.close()


def search_batch(config: BenchConfig, workload: Workload, device: torch.device, args: argparse.Namespace,
                 deadline: Optional[common.Deadline] = None, run: Optional[ConfigRun] = None,
                 start: Optional[int] = None) -> Optional[int]:
    """Largest per-GPU batch (a multiple of --batch-multiple, at most --max-batch) whose steps fit;
    once ``deadline`` has passed the search stops at the largest batch known to fit.

    ``run``: the configuration's ``ConfigRun`` to probe with (its compiled graphs reused; default:
    a new one, closed at the end). ``start``: a batch known to fit (e.g. one just timed), from
    which the search doubles; default --batch-multiple."""
    multiple = args.batch_multiple
    deadline = deadline or common.Deadline(None)
    own = run is None
    run = run or ConfigRun(config, workload, device, args)

    def fits(k: int) -> bool:
        # Two steps: the first allocates the optimizer state, the second runs with it in place.
        result = run.measure(k * multiple, warmup_steps=1, steps=1)
        print(f"  {config.name}: batch {k * multiple} {'out of memory' if result is None else 'fits'}", flush=True)
        return result is not None

    try:
        first = max(1, (start or multiple) // multiple)
        k = largest_fitting(fits, first, max(first, args.max_batch // multiple), out_of_time=deadline.passed)
    finally:
        if own:
            run.close()
    if k is not None and deadline.passed():
        print(f"  {config.name}: --search-budget spent; batch {k * multiple} is a lower bound", flush=True)
    return None if k is None else k * multiple


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class RunInfo:
    model: str
    device: str
    world_size: int
    peak_tflops: Optional[float]
    date: str
    commit: str
    torch_version: str


def row_for(config: BenchConfig, info: RunInfo, batch_size: Optional[int], status: str,
            m: Optional[Measurement] = None) -> dict:
    """One CSV row. Throughput counts every rank: samples/s = batch x world x steps / timed seconds."""
    row = dict(config=config.name, model=info.model, status=status, precision=config.precision,
               zero_degree="" if config.zero_degree is None else config.zero_degree, kernels=config.kernels,
               compile=config.compile,
               activation_checkpointing="" if config.selective_ratio is None else config.selective_ratio,
               offload=config.offload, batch_per_gpu=batch_size or "", world_size=info.world_size,
               step_ms_median="", step_ms_mean="", samples_per_s="", tokens_per_s="", tflops_per_gpu="", mfu="",
               peak_alloc_gib="", peak_reserved_gib="", speedup_vs_torch_fp32="", speedup_vs_torch_bf16_compile="",
               device=info.device, peak_tflops=info.peak_tflops or "", date=info.date, commit=info.commit,
               torch=info.torch_version)
    if m is None:
        return row
    mean_s = statistics.fmean(m.step_ms) / 1e3
    samples_per_s = batch_size * info.world_size / mean_s
    # Model FLOPs per GPU per second: training FLOPs per sample x samples/s, divided over the GPUs.
    tflops = train_flops(m.forward_flops_per_sample) * samples_per_s / info.world_size / 1e12
    utilisation = mfu(tflops, info.peak_tflops)
    row.update(step_ms_median=significant(statistics.median(m.step_ms)), step_ms_mean=significant(mean_s * 1e3),
               samples_per_s=significant(samples_per_s),
               tokens_per_s=significant(samples_per_s * m.tokens_per_sample),
               tflops_per_gpu=significant(tflops), mfu="" if utilisation is None else significant(utilisation))
    if m.peak_alloc_bytes is not None:
        row.update(peak_alloc_gib=significant(m.peak_alloc_bytes / GIB),
                   peak_reserved_gib=significant(m.peak_reserved_bytes / GIB))
    return row


def significant(value: float, digits: int = 4) -> float:
    """``value`` rounded to ``digits`` significant digits (CPU smoke runs give tiny rates)."""
    return float(f"{value:.{digits}g}")


def fill_speedups(rows: List[dict]) -> None:
    """samples/s over each baseline's samples/s (each at its own batch), where both were measured."""
    for baseline in BASELINES:
        ref = next((r["samples_per_s"] for r in rows if r["config"] == baseline and r["samples_per_s"] != ""), None)
        column = "speedup_vs_" + baseline.replace("-", "_")
        for r in rows:
            if ref and r["samples_per_s"] != "":
                r[column] = round(r["samples_per_s"] / ref, 3)


def timed_row(run: ConfigRun, info: RunInfo, batch: Optional[int], warmup_steps: int, steps: int) -> dict:
    """The row of ``run`` timed at ``batch`` (None: nothing fitted in the search), out-of-memory included."""
    if batch is None:
        return row_for(run.config, info, None, "oom at the smallest batch")
    result = run.measure(batch, warmup_steps, steps)
    return row_for(run.config, info, batch, "oom" if result is None else "ok", result)


def describe(row: dict) -> str:
    """One line of progress for a row."""
    if row["status"] != "ok":
        return f"{row['config']}: batch {row['batch_per_gpu'] or '-'}: {row['status']}"
    return (f"{row['config']}: batch {row['batch_per_gpu']}, {row['step_ms_median']} ms/step, {row['samples_per_s']} "
            f"samples/s, {row['tflops_per_gpu']} TFLOP/s/GPU, MFU {row['mfu'] or '-'}, "
            f"peak {row['peak_alloc_gib'] or '-'} GiB")


def write_tables(rows: List[dict], info: RunInfo, stem: str) -> None:
    """The CSV and the Markdown table of the rows so far (rewritten whole, so always complete files)."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    write_csv(rows, stem + ".csv")
    with open(stem + ".md", "w") as f:
        f.write(markdown_table(rows, info))


def result_stem(prefix: str, info: RunInfo, config: str = "") -> str:
    """``<prefix>_[<config>_]<model>_<device>`` made file-safe, e.g. train_step_DiT_XL_2_NVIDIA_H100_80GB_HBM3."""
    return common.result_name(prefix, " ".join(filter(None, (config, info.model, info.device))))


def write_csv(rows: List[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: List[dict], info: RunInfo) -> str:
    """The README table: one line per configuration, speed-ups as ratios over both baselines."""
    lines = [f"{info.model}, {info.world_size} x {info.device}, {info.date}, commit {info.commit}, "
             f"torch {info.torch_version}",
             "",
             "| configuration | batch/GPU | samples/s | vs torch-fp32 | vs torch-bf16-compile | TFLOP/s/GPU | MFU "
             "| peak GiB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(value, fmt, suffix=""):
        return "-" if value == "" else format(value, fmt) + suffix

    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['config']} | {r['batch_per_gpu'] or '-'} | {r['status']} | | | | | |")
            continue
        lines.append(f"| {r['config']} | {r['batch_per_gpu']} | {r['samples_per_s']:.1f} | "
                     f"{cell(r['speedup_vs_torch_fp32'], '.2f', 'x')} | "
                     f"{cell(r['speedup_vs_torch_bf16_compile'], '.2f', 'x')} | "
                     f"{r['tflops_per_gpu']:.1f} | {cell('' if r['mfu'] == '' else 100 * r['mfu'], '.1f', '%')} | "
                     f"{cell(r['peak_alloc_gib'], '.1f')} |")
    return "\n".join(lines) + "\n"


def plot(rows: List[dict], info: RunInfo, path: str) -> None:
    """Bars of samples/s per configuration (labelled with the speed-up over torch-fp32 and the MFU)
    and of peak memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    names = [r["config"] for r in ok]
    colors = ["tab:gray" if n in BASELINES else "tab:blue" for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(10, 1.3 * len(names) + 4), 5))
    bars = left.bar(names, [r["samples_per_s"] for r in ok], color=colors)
    labels = []
    for r in ok:
        parts = [f"{r['speedup_vs_torch_fp32']:.2f}x" if r["speedup_vs_torch_fp32"] != "" else ""]
        parts.append(f"MFU {100 * r['mfu']:.0f}%" if r["mfu"] != "" else "")
        labels.append("\n".join(p for p in parts if p))
    left.bar_label(bars, labels=labels, fontsize=7)
    left.set_ylabel("samples/s (all GPUs)")
    left.set_title("throughput (label: speed-up over torch-fp32, MFU)")
    if any(r["peak_alloc_gib"] != "" for r in ok):
        right.bar(names, [r["peak_alloc_gib"] or 0.0 for r in ok], color=colors)
        right.set_ylabel("peak allocated GiB per GPU")
        right.set_title("peak memory")
    else:  # no CUDA memory statistics (a CPU run): show the step time instead
        right.bar(names, [r["step_ms_median"] for r in ok], color=colors)
        right.set_ylabel("median step time (ms)")
        right.set_title("step time")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        for tick in ax.get_xticklabels():
            tick.set_ha("right")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{info.model} training step, {info.world_size} x {info.device}, {info.date}, commit {info.commit}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Profile
# ----------------------------------------------------------------------------------------------

# Kernel name patterns -> category, for a one-line summary of where the device time goes.
# Checked in order: attention before matmul (fused attention kernels are CUTLASS kernels too).
KERNEL_CATEGORIES = (
    ("communication", r"nccl|all_?reduce|reduce_scatter|all_?gather|gloo"),
    ("attention", r"flash|fmha|sdpa|attention"),
    ("matmul", r"gemm|cutlass|cublas|xmma|nvjet|sm\d+_|ampere_|hopper_|triton_tem|"
               r"aten::(mm|addmm|bmm|matmul|linear|convolution|mkldnn_convolution)$"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("triton", r"triton"),  # inductor's fused kernels (triton_poi/red/per_...) and our Triton kernels
    ("norm", r"layer_?norm"),
    ("elementwise", r"elementwise|vectorized|unrolled|aten::(add|mul|sub|div|copy_|gelu|silu|sqrt)"),
)


def categorize(name: str) -> str:
    return next((cat for cat, pattern in KERNEL_CATEGORIES if re.search(pattern, name, re.IGNORECASE)), "other")


def profile_table(trainer: Trainer, batch: dict, steps: int, device: torch.device, top: int) -> str:
    """A markdown table of the ``top`` kernels by self device time per step (CPU: operators by self
    CPU time), and the time per category."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            trainer.step(batch)
        synchronize(device)
    on_device = device.type == "cuda"
    events = list(prof.key_averages())
    if on_device:
        # Only the GPU's own events (kernels, copies): a CPU operator's "self device time" is the
        # time of the kernels it launched, which would count them twice.
        events = [e for e in events if e.device_type != DeviceType.CPU and e.self_device_time_total > 0]
    self_us = (lambda e: e.self_device_time_total) if on_device else (lambda e: e.self_cpu_time_total)
    events.sort(key=self_us, reverse=True)
    total = sum(self_us(e) for e in events) or 1.0
    per_category: Dict[str, float] = {}
    for e in events:
        per_category[categorize(e.key)] = per_category.get(categorize(e.key), 0.0) + self_us(e)
    unit = "device" if on_device else "CPU"
    lines = [f"{unit} time per step {total / steps / 1e3:.2f} ms over {steps} profiled steps; by category: "
             + ", ".join(f"{cat} {100 * us / total:.1f}%"
                         for cat, us in sorted(per_category.items(), key=lambda kv: -kv[1])),
             "",
             f"| # | kernel | category | calls/step | ms/step | % of {unit} time |",
             "|---:|---|---|---:|---:|---:|"]
    for i, e in enumerate(events[:top], 1):
        name = e.key if len(e.key) <= 90 else e.key[:87] + "..."
        lines.append(f"| {i} | `{name.replace('|', '/')}` | {categorize(e.key)} | {e.count / steps:g} | "
                     f"{self_us(e) / steps / 1e3:.3f} | {100 * self_us(e) / total:.1f} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.machine()}"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="DiT-XL/2", help="registered model name (default DiT-XL/2)")
    parser.add_argument("--image-size", type=int, default=256, help="image side in pixels; latents are 1/8 of it")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS),
                        help="configurations to measure, in order")
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32", "fp8"), default="bf16",
                        help="precision of the zero<D> configurations (the baselines fix their own); fp8: bf16 "
                             "with the blocks' Linear layers in float8 (torchao; compute capability >= 8.9)")
    parser.add_argument("--batch-size", type=int, default=32, help="per-GPU batch when not searching")
    parser.add_argument("--batch-search", action="store_true",
                        help="per configuration, the largest per-GPU batch that fits")
    parser.add_argument("--batch-multiple", type=int, default=8, help="searched batches are multiples of this")
    parser.add_argument("--max-batch", type=int, default=1024, help="largest per-GPU batch the search tries")
    parser.add_argument("--search-budget", type=float, default=420.0,
                        help="seconds for all batch searches together, shared equally by the configurations; a "
                             "search that runs out stops at the largest batch known to fit (0: no limit)")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    parser.add_argument("--grad-clip", type=float, default=0.0, help="plugin gradient clipping (0: off, as DiT)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (eager: a quick check)")
    parser.add_argument("--peak-tflops", type=float,
                        help="dense bf16 peak of the device for MFU (default: by device name)")
    parser.add_argument("--profile", metavar="CONFIG", help="also profile this configuration and write its top kernels")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=common.RESULTS_DIR, help="where the CSV, PNG and tables go")
    args = parser.parse_args(argv)
    for flag in ("batch_size", "batch_multiple", "max_batch", "steps", "profile_steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.warmup_steps < 1:
        parser.error("--warmup-steps must be >= 1: the first step compiles and allocates the optimizer state")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible; pass --device cpu for a smoke run")
    if args.precision == "fp8":
        from opendit_lite.precision import check_fp8_supported

        try:
            check_fp8_supported(torch.device(args.device))
        except ValueError as error:  # ConfigError: no FP8 tensor cores here, or no torchao
            parser.error(f"--precision fp8: {error}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    configs = []
    for name in args.configs:
        try:
            configs.append(parse_config(name, args.precision))
        except ValueError as error:
            raise SystemExit(f"error: {error}")
    profile_config = None
    if args.profile:
        try:
            profile_config = parse_config(args.profile, args.precision)
        except ValueError as error:
            raise SystemExit(f"error: --profile: {error}")

    from opendit_lite.distributed.process_group import cleanup_distributed, init_distributed

    dist_info = init_distributed()  # the plugin needs a process group, also for one process
    if args.batch_search and dist_info.world_size > 1:
        raise SystemExit("error: --batch-search runs on one process (an OOM on one rank would stall the "
                         "others in a collective); search with one GPU, then pass --batch-size to torchrun")
    device = dist_info.device if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        # DiT's recipe: TF32 matmuls and convolutions for fp32 (no effect on bf16 compute).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = device_name(device)
    info = RunInfo(model=args.model, device=name, world_size=dist_info.world_size,
                   peak_tflops=args.peak_tflops or device_peak_tflops(name),
                   date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), commit=common.git_commit(),
                   torch_version=torch.__version__)
    say = print if dist_info.is_main else (lambda *a, **k: None)
    say(f"{info.model} on {info.world_size} x {info.device} (dense bf16 peak "
        f"{info.peak_tflops or 'unknown: MFU left blank, pass --peak-tflops'} TFLOP/s), commit {info.commit}",
        flush=True)
    workload = build_workload(args.model, args.image_size, args.num_classes)

    rows, batches, failed = [], {}, False
    stem = os.path.join(args.out_dir, result_stem("train_step", info))
    search_deadline = common.Deadline(args.search_budget)
    for index, config in enumerate(configs):
        run = ConfigRun(config, workload, device, args)
        try:
            batch = args.batch_size
            if args.batch_search:  # each configuration gets an equal share of what is left of the budget
                share = common.Deadline(search_deadline.remaining() / (len(configs) - index))
                batch = search_batch(config, workload, device, args, share, run=run)
            batches[config.name] = batch
            row = timed_row(run, info, batch, args.warmup_steps, args.steps)
        except Exception as error:  # noqa: BLE001  (one broken configuration must not lose the others)
            failed = True
            traceback.print_exc()
            row = row_for(config, info, batches.get(config.name), f"error: {type(error).__name__}: {error}"[:200])
        finally:
            run.close()
        rows.append(row)
        say(describe(row), flush=True)
        fill_speedups(rows)
        if dist_info.is_main:  # after every configuration: a run cut short keeps what it measured
            write_tables(rows, info, stem)

    if dist_info.is_main:
        plot(rows, info, stem + ".png")
        print(markdown_table(rows, info))
        for ext in (".csv", ".md", ".png"):
            print("wrote", stem + ext)

    if profile_config is not None:
        batch = batches.get(profile_config.name) or args.batch_size
        trainer = build_trainer(profile_config, workload, device, args)
        data = workload.make_batch(batch, device)
        warm_up(trainer, data, args.warmup_steps, device)  # compilation and allocation outside the profile
        table = profile_table(trainer, data, args.profile_steps, device, args.profile_top)
        del trainer
        release_memory()
        if dist_info.is_main:
            path = os.path.join(args.out_dir, result_stem("train_step_profile", info, profile_config.name) + ".md")
            with open(path, "w") as f:
                f.write(f"{profile_config.name}, batch {batch}/GPU, {info.model} on {info.device}, {info.date}, "
                        f"commit {info.commit}\n\n{table}")
            print(table)
            print("wrote", path)

    cleanup_distributed()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
