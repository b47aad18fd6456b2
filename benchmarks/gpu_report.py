"""The prepared GPU commands: the GPU tests and the project's headline figures in two bounded runs
(two parts, one 10-minute command each), written as they are measured. docs/gpu.md says how to run
them on the offline GPU machine (``make gpu-report``: the wheels of .whl/ installed offline, then
this script with ``--budget 480``).

    python benchmarks/gpu_report.py --budget 480                # one CUDA GPU: the first part (dit)
    python benchmarks/gpu_report.py --part wan --budget 480     # the second part (wan)
    python benchmarks/gpu_report.py --only kernels plan --budget 150   # a rerun of some sections
    python benchmarks/gpu_report.py --dry-run                    # the CPU: both parts at toy sizes
    python benchmarks/gpu_report.py --readme-table               # the README's table from the committed results

Sections, in priority order; each runs in its own process under its own timeout (a hang or a crash
loses that section's unfinished part only), and every row is written the moment it is measured:

    tests        pytest -m "gpu or kernels": the GPU tests and the Triton kernel tests on the real
                 compiler; pass/fail counts and failing test ids (the full log is pytest.log)
    train_bf16   DiT-XL/2 256 px bf16 training step at batch 128: the plain loop with torch.compile
                 (baseline), then our best configuration (zero0+kernels+compile), then that one at the
                 largest batch a search bounded to 90 s finds; samples/s, ratio to the baseline, MFU,
                 peak memory
    train_fp8    the best configuration with precision fp8 (torchao float8) at batch 128 against the
                 bf16 rows, and the loss of 300 steps of fp8 against bf16 (benchmarks/fp8_parity.py)
    kernels      fused AdaLN, gated residual + AdaLN and LayerNorm at the report shapes (DiT-XL/2 and
                 video), forward, backward and both, against eager PyTorch, torch.compile of the same
                 reference and the copy bandwidth measured in the same run
    plan         the memory planner's prediction against the measured peak: a Wan-1.3B-shaped
                 diffusers transformer (forward activations) and DiT-XL/2 (a whole ZeRO-2 step)
    max_seq_len  the largest DiT-XL/2 step without checkpointing, with it, and with offload, in the
                 time left
  and the second part (``--part wan``; benchmarks/wan_report.py):
    wan_train    a Wan 2.1 1.3B-shaped transformer at 480x832, 33 and 81 frames, full fine-tune and
                 LoRA: our best settings against the loop a diffusers user writes; tokens/s, MFU
                 (attention counted), peak memory
    wan_24gb     a Wan 2.1 14B-shaped LoRA step with the planner's 24 GiB settings under a 24 GiB
                 cap, and with its settings for the whole device uncapped; peaks, step times and the
                 planner's predictions

Each section gets its share of ``--budget``: the sections of a part but its last have caps
(SECTIONS) that add up to at most the default budget, time a section does not use goes to the ones
after it, and the last takes what is left. Every row carries the device name and the torch and
triton versions.

Files, in $OUT when set, else benchmarks/results/ (the dry run: outputs/gpu_report_dry_run/):
results.json (every row of every section; ``check_schema`` validates it), summary.md (the same as
tables, rewritten with every row) and pytest.log; the second part: results_wan.json and
summary_wan.md.
"""

import argparse
import contextlib
import dataclasses
import datetime
import io
import json
import math
import multiprocessing
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):  # the package and tests.kernels; the sibling benchmark scripts
    if path not in sys.path:
        sys.path.insert(0, path)

SCHEMA_VERSION = 1
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")
DRY_RUN_DIR = os.path.join(ROOT, "outputs", "gpu_report_dry_run")
RESULTS_NAME, SUMMARY_NAME, PYTEST_LOG = "results.json", "summary.md", "pytest.log"
# The report in two parts, one 10-minute command each (docs/gpu.md); the dry run runs both at once.
PARTS = {"dit": ("tests", "train_bf16", "train_fp8", "kernels", "plan", "max_seq_len"),
         "wan": ("wan_train", "wan_24gb")}
PART_BUDGET_S = 480.0  # each part's default budget on the GPU


def result_files(part: str) -> Tuple[str, str]:
    """(results, summary) file names of a part: the second part's beside the first's in one folder."""
    return (RESULTS_NAME, SUMMARY_NAME) if part in ("dit", "all") else (f"results_{part}.json", f"summary_{part}.md")
STATUSES = ("pending", "running", "ok", "failed", "timeout", "skipped")
STAMP = ("device", "torch", "triton")  # carried by every row
MIN_SECTION_S = 10.0  # a section is not started with less time than this
EXIT_SKIPPED = 3      # a section's process exits with this when it decided not to run


@dataclasses.dataclass(frozen=True)
class Options:
    """What a shorter run may narrow (the defaults are the full report's)."""

    tests: Tuple[str, ...] = ()                            # pytest ids or paths; () every GPU/kernel test file
    kernel_shapes: Tuple[Tuple[int, int, int], ...] = ()   # (B, N, D); () the report's shapes
    batch_search: bool = True                              # train_bf16's largest-batch search
    train_steps: Optional[Tuple[int, int]] = None          # (warm-up, timed) steps; None the report's
    part: str = "dit"                                      # which part's files the sections write (PARTS)
    wan_frames: Tuple[int, ...] = ()                       # wan_train's clips by frame count; () all


# ----------------------------------------------------------------------------------------------
# Results: results.json holds everything; summary.md is rendered from it after every change
# ----------------------------------------------------------------------------------------------

def load_results(out_dir: str, part: str = "dit") -> dict:
    with open(os.path.join(out_dir, result_files(part)[0])) as f:
        return json.load(f)


def write_results(out_dir: str, doc: dict) -> None:
    """results.json (replaced atomically: a process killed mid-write leaves the previous file) and summary.md."""
    results_name, summary_name = result_files(doc["run"].get("part", "dit"))
    path = os.path.join(out_dir, results_name)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
    os.replace(path + ".tmp", path)
    summary = os.path.join(out_dir, summary_name)
    with open(summary + ".tmp", "w") as f:
        f.write(render_summary(doc))
    os.replace(summary + ".tmp", summary)


def update_results(out_dir: str, change: Callable[[dict], None], part: str = "dit") -> dict:
    doc = load_results(out_dir, part)
    change(doc)
    write_results(out_dir, doc)
    return doc


def section_entry(doc: dict, name: str) -> dict:
    return next(s for s in doc["sections"] if s["name"] == name)


def clean(value):
    """JSON-safe: NaN and infinities become None, tuples lists, other objects their str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


# ----------------------------------------------------------------------------------------------
# What a section's process gets
# ----------------------------------------------------------------------------------------------

class SectionSkipped(Exception):
    """Raised by a section that cannot run here; the message is recorded as its reason."""


class Context:
    """A section's view of the run: toy sizes or not, its deadline, and ``record``/``note``, which
    write to results.json and summary.md at once."""

    def __init__(self, out_dir: str, section: str, dry_run: bool, deadline: float, options: Options = Options()):
        self.out_dir, self.section, self.dry_run, self.deadline = out_dir, section, dry_run, deadline
        self.options = options
        self._stamp: Optional[Dict[str, str]] = None

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def stamp(self) -> Dict[str, str]:
        if self._stamp is None:
            self._stamp = versions()
        return self._stamp

    def record(self, row: dict) -> None:
        row = {**clean(row), **self.stamp()}
        update_results(self.out_dir, lambda doc: section_entry(doc, self.section)["rows"].append(row),
                       self.options.part)
        print(f"[{self.section}] " + ", ".join(f"{k}={v}" for k, v in row.items() if k not in STAMP), flush=True)

    def note(self, text: str) -> None:
        update_results(self.out_dir, lambda doc: section_entry(doc, self.section)["notes"].append(text),
                       self.options.part)
        print(f"[{self.section}] note: {text}", flush=True)

    def path(self, name: str) -> str:
        return os.path.join(self.out_dir, name)


def versions(context: bool = True) -> Dict[str, str]:
    """The device name and the torch and triton versions every row carries. ``context=False`` (the
    parent process) reads the GPU's name from nvidia-smi, so that the parent holds no CUDA context
    (and none of the GPU's memory) while the sections measure."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    if not torch.cuda.is_available():
        device = f"CPU {platform.machine()}"
    elif context:
        device = torch.cuda.get_device_name()
    else:
        device = gpu_name_from_nvidia_smi() or "CUDA GPU"
    return {"device": device, "torch": torch.__version__, "triton": triton_version}


def gpu_name_from_nvidia_smi() -> Optional[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    names = out.stdout.strip().splitlines()
    return names[0].strip() if out.returncode == 0 and names else None


def cuda_device():
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


# ----------------------------------------------------------------------------------------------
# Section 1: the GPU and kernel tests
# ----------------------------------------------------------------------------------------------

# The dry run's few tests: Triton kernels under the interpreter, one GPU test that skips.
DRY_RUN_TESTS = ["tests/kernels/test_layernorm.py", "-k", "fp32_shapes or apex"]
RESULT_LINE = re.compile(r"(?:(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+))|"
                         r"(?:(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS))")
COLLECT_ERROR = re.compile(r"ERROR collecting (\S+)")


def parse_pytest_log(text: str) -> dict:
    """Per-test outcomes from a ``pytest -v`` log (with or without pytest-xdist), the collection
    errors, and whether pytest reached its closing line."""
    outcomes: Dict[str, str] = {}
    for match in RESULT_LINE.finditer(text):
        outcome, test = (match.group(1), match.group(2)) if match.group(1) else (match.group(4), match.group(3))
        outcomes[test] = outcome  # the last word on a test wins (an error in teardown after a pass)
    collect_errors = sorted(set(COLLECT_ERROR.findall(text)))
    for path in collect_errors:  # its "ERROR <path>" summary line is the same error
        outcomes.pop(path, None)
    counts = {k: sum(1 for v in outcomes.values() if v == k.upper()) for k in
              ("passed", "failed", "error", "skipped", "xfail", "xpass")}
    failing = sorted(t for t, v in outcomes.items() if v in ("FAILED", "ERROR"))
    finished = bool(re.search(r"^=+ .*\b(passed|failed|skipped|error|errors|deselected|no tests ran)\b.* in [\d.]+s",
                              text, re.MULTILINE))
    return dict(passed=counts["passed"], failed=counts["failed"], errors=counts["error"] + len(collect_errors),
                skipped=counts["skipped"], xfailed=counts["xfail"], xpassed=counts["xpass"], total=len(outcomes),
                failing=failing[:60], collection_errors=collect_errors, finished=finished)


def gpu_test_files() -> List[str]:
    """The test files that can hold ``gpu or kernels`` tests: tests/kernels (marked ``kernels`` by its
    conftest) and every test file that writes the ``gpu`` marker. Collecting these alone instead of
    the whole suite saves every pytest-xdist worker importing all the test modules."""
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "tests")):
        for name in sorted(files):
            if not (name.startswith("test_") and name.endswith(".py")):
                continue
            path = os.path.join(folder, name)
            with open(path, errors="replace") as f:
                if os.path.relpath(folder, ROOT).split(os.sep)[:2] == ["tests", "kernels"] or "mark.gpu" in f.read():
                    found.append(os.path.relpath(path, ROOT))
    return sorted(found)


# Colossal-AI's Adam kernels (HybridAdam: Gemini's optimizer) compile just in time on first use,
# about 100 s on a fresh GPU machine. Started with pytest rather than when the first Gemini test
# reaches it, so that the build overlaps the kernel tests; torch's extension loader locks the build
# folder, so the test that needs the kernels waits for this build instead of starting its own.
PREBUILD = ("from colossalai.kernel.kernel_loader import CPUAdamLoader, FusedOptimizerLoader; "
            "CPUAdamLoader().load(); FusedOptimizerLoader().load()")  # HybridAdam's order


def section_tests(ctx: Context) -> None:
    import torch

    prebuild = None
    if torch.cuda.is_available():
        prebuild = subprocess.Popen([sys.executable, "-c", PREBUILD], cwd=ROOT, start_new_session=True)
    try:
        run_tests(ctx)
    finally:
        if prebuild is not None and prebuild.poll() is None:
            os.killpg(prebuild.pid, signal.SIGKILL)


def run_tests(ctx: Context) -> None:
    import torch

    workers = 0 if ctx.dry_run else min(8, max(1, (os.cpu_count() or 2) // 2))
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu or kernels", "-v", "-rfE", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", "--timeout", "240", "-n", str(workers)]
    cmd += DRY_RUN_TESTS if ctx.dry_run else list(ctx.options.tests) or gpu_test_files()
    ctx.note(f"command: {' '.join(cmd[1:])} ({'CUDA' if torch.cuda.is_available() else 'CPU, Triton interpreter'})")
    # The tests test the kernels: the dispatch that may serve a shape with torch.compile instead (and would
    # compile a reference at every new shape) is pinned to the kernel, except in its own test.
    env = dict(os.environ, PYTHONUNBUFFERED="1", OPENDIT_KERNEL_CHOICE="fused")
    log_path = ctx.path(PYTEST_LOG)
    with open(log_path, "w") as log:
        # pytest leads its own process group so that its xdist workers stop with it
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(5.0, ctx.remaining() - 10.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    with open(log_path, errors="replace") as f:
        text = f.read()
    result = parse_pytest_log(text)
    ctx.record(dict(kind="tests", selection="gpu or kernels", workers=workers, pytest_exit=rc, log=PYTEST_LOG,
                    **result))
    if rc is None and not result["finished"]:
        raise RuntimeError(f"pytest did not finish within the section's time; {result['total']} tests reported")
    if result["failed"] or result["errors"] or rc not in (0, 5, None):  # None: stopped after its closing line
        raise RuntimeError(f"pytest: {result['failed']} failed, {result['errors']} errors (exit {rc})")


# ----------------------------------------------------------------------------------------------
# Sections 2 and 3: the DiT-XL/2 training step in bf16 and in fp8
# ----------------------------------------------------------------------------------------------

BASELINE, BEST = "torch-bf16-compile", "zero0+kernels+compile"
SEARCH_S = 90.0  # the one batch search's bound


@dataclasses.dataclass(frozen=True)
class StepSizes:
    model: str
    image_size: int
    batch: int
    warmup: int
    steps: int
    max_batch: int
    compile_backend: str


GPU_STEP = StepSizes("DiT-XL/2", 256, 128, 3, 10, 1024, "inductor")
TOY_STEP = StepSizes("DiT-T/2", 32, 2, 1, 1, 8, "eager")  # eager: inductor's CPU compile alone takes minutes


def train_step_setup(ctx: Context, precision: str):
    """train_step's module, parsed arguments, workload, run info and device for this run's sizes."""
    import train_step as ts

    from opendit_lite.distributed.process_group import init_distributed

    sizes = TOY_STEP if ctx.dry_run else GPU_STEP
    if ctx.options.train_steps is not None:
        sizes = dataclasses.replace(sizes, warmup=ctx.options.train_steps[0], steps=ctx.options.train_steps[1])
    device = cuda_device()
    argv = ["--model", sizes.model, "--image-size", str(sizes.image_size), "--batch-size", str(sizes.batch),
            "--warmup-steps", str(sizes.warmup), "--steps", str(sizes.steps), "--max-batch", str(sizes.max_batch),
            "--compile-backend", sizes.compile_backend, "--device", device.type, "--precision", precision]
    if ctx.dry_run:
        argv += ["--num-classes", "10", "--batch-multiple", "2", "--peak-tflops", "1.0"]
    args = ts.parse_args(argv)
    init_distributed()
    if device.type == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = ts.device_name(device)
    info = ts.RunInfo(model=args.model, device=name, world_size=1,
                      peak_tflops=args.peak_tflops or ts.device_peak_tflops(name),
                      date=datetime.date.today().isoformat(), commit=ts.common.git_commit(),
                      torch_version=versions()["torch"])
    return ts, args, ts.build_workload(args.model, args.image_size, args.num_classes), info, device, sizes


def step_row(row: dict, phase: str, reference: Dict[str, Optional[float]]) -> dict:
    """A train_step row with its phase and ``vs_<name>``, its throughput over each ``reference``
    (name -> samples/s, None where that reference was not measured)."""
    row = dict(kind="throughput", phase=phase, **row)
    for name, samples in reference.items():
        ok = row["samples_per_s"] not in ("", None) and samples
        row["vs_" + name] = round(row["samples_per_s"] / samples, 3) if ok else None
    return row


def section_train_bf16(ctx: Context) -> None:
    ts, args, workload, info, device, sizes = train_step_setup(ctx, "bf16")
    reference: Dict[str, Optional[float]] = {"baseline": None}
    for name in (BASELINE, BEST):
        run = ts.ConfigRun(ts.parse_config(name, "bf16"), workload, device, args)
        try:
            row = ts.timed_row(run, info, sizes.batch, sizes.warmup, sizes.steps)
            ctx.record(step_row(row, f"batch {sizes.batch}", reference))
            if name == BASELINE and row["status"] == "ok":
                reference["baseline"] = row["samples_per_s"]
            if name == BEST and row["status"] == "ok" and not ctx.options.batch_search:
                ctx.note("batch search not asked for (--no-batch-search)")
            elif name == BEST and row["status"] == "ok":
                # the search reuses this configuration's compiled graphs, starting from the batch just timed
                final_s = 30.0 if not ctx.dry_run else 1.0  # the warm-up and timed steps at the batch found
                budget = min(SEARCH_S if not ctx.dry_run else 1.0, ctx.remaining() - final_s)
                if budget <= 0:
                    ctx.note("batch search skipped: no time left in the section")
                    continue
                start = time.monotonic()
                batch = ts.search_batch(run.config, workload, device, args, ts.common.Deadline(budget), run=run,
                                        start=sizes.batch)
                searched = time.monotonic() - start
                bound = " (search cut short: a lower bound)" if searched >= budget else ""
                row = ts.timed_row(run, info, batch, sizes.warmup, sizes.steps)
                ctx.record(step_row(dict(row, search_s=round(searched, 1), builds=run.builds),
                                    f"largest batch, search <= {budget:.0f} s{bound}", reference))
        finally:
            run.close()


def section_train_fp8(ctx: Context) -> None:
    import torch

    from opendit_lite.precision import check_fp8_supported

    device = cuda_device()
    try:
        check_fp8_supported(device)
        fp8 = True
    except ValueError as error:
        if not ctx.dry_run:
            raise SectionSkipped(str(error))
        fp8 = False
        ctx.note(f"refused here, as train_step.py --precision fp8 refuses (exit {train_step_fp8_exit_code()}): "
                 f"{error} The dry run trains the loss comparison in bf16 twice instead.")
    if fp8:
        ts, args, workload, info, device, sizes = train_step_setup(ctx, "fp8")
        measured = [s for s in load_results(ctx.out_dir, ctx.options.part)["sections"] if s["name"] == "train_bf16"]
        phase = f"batch {sizes.batch}"
        bf16 = {r["config"]: r["samples_per_s"] for s in measured for r in s["rows"]
                if r.get("kind") == "throughput" and r.get("status") == "ok" and r.get("phase") == phase}
        reference = {"baseline": bf16.get(BASELINE), "bf16_best": bf16.get(BEST)}
        run = ts.ConfigRun(ts.parse_config(BEST, "fp8"), workload, device, args)
        try:
            ctx.record(step_row(ts.timed_row(run, info, sizes.batch, sizes.warmup, sizes.steps),
                                f"batch {sizes.batch}", reference))
        finally:
            run.close()
        torch.cuda.empty_cache()
    loss_parity(ctx, device, fp8)


def train_step_fp8_exit_code() -> int:
    """What ``train_step.py --precision fp8`` exits with on this machine (2: refused with a message)."""
    import train_step as ts

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ts.parse_args(["--precision", "fp8", "--device", "cpu"])
    except SystemExit as exit:
        return int(exit.code or 0)
    return 0


# fp8_parity.py's default model and data at 300 steps: the loss gap is a property of the numerics,
# and DiT-S/2 at 32 px trains 300 steps in seconds without compiling.
LOSS_STEPS, LOSS_BATCH = 300, 64


def loss_parity(ctx: Context, device, fp8: bool) -> None:
    import fp8_parity

    steps, batch = (LOSS_STEPS, LOSS_BATCH) if not ctx.dry_run else (6, 2)
    args = argparse.Namespace(model="DiT-S/2" if not ctx.dry_run else "DiT-T/2", steps=steps, batch_size=batch,
                              image_size=32 if not ctx.dry_run else 16, num_samples=steps * batch, lr=1e-4, seed=0,
                              compile=False, workers=4 if not ctx.dry_run else 0)
    runs = {"bf16": fp8_parity.train(args, fp8=False, device=device),
            "fp8": fp8_parity.train(args, fp8=fp8, device=device)}
    tail = max(1, steps // 10)
    final = {name: sum(r["loss"][-tail:]) / tail for name, r in runs.items()}
    ms = {name: sorted(r["ms"])[len(r["ms"]) // 2] if r["ms"] else None for name, r in runs.items()}
    ctx.record(dict(kind="loss", model=args.model, image_size=args.image_size, batch=batch, steps=steps,
                    fp8=fp8, loss_bf16=round(final["bf16"], 5), loss_fp8=round(final["fp8"], 5),
                    gap_pct=round(100 * (final["fp8"] / final["bf16"] - 1), 3), target_pct=2.0,
                    step_ms_bf16=ms["bf16"], step_ms_fp8=ms["fp8"], mean_over_last=tail))


# ----------------------------------------------------------------------------------------------
# Section 4: the fused kernels against eager, compile and the copy bandwidth
# ----------------------------------------------------------------------------------------------

TOY_KERNEL_SHAPES = [(2, 8, 32)]


def section_kernels(ctx: Context) -> None:
    import bench_fused_adaln
    import bench_layernorm
    import common
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = list(ctx.options.kernel_shapes) or (TOY_KERNEL_SHAPES if ctx.dry_run else bench_fused_adaln.REPORT_SHAPES)
    backend = "eager" if device == "cpu" else "inductor"
    if device == "cpu":
        ctx.note("CPU: Triton interpreter, wall-clock timings and torch.compile's eager backend; the numbers "
                 "mean nothing, the code path is the GPU one")
    stamp = ctx.stamp()
    info = (stamp["device"], stamp["torch"], stamp["triton"])
    copy_gbps = common.copy_bandwidth_gbps(**({} if device == "cuda" else dict(nbytes=2**20, device="cpu")))
    ctx.record(dict(kind="copy", kernel="device-to-device copy", gbps=round(copy_gbps, 1)))
    dtype = torch.bfloat16
    rep = 50  # milliseconds of timed calls per measurement
    benches = (
        ("fused_adaln", lambda s: bench_fused_adaln.bench_shape(s, "sample", dtype, copy_gbps, rep, info, device,
                                                                 backend)),
        ("gated_residual", lambda s: bench_fused_adaln.bench_residual_shape(s, "sample", dtype, copy_gbps, rep, info,
                                                                            device, backend)),
        ("layernorm", lambda s: bench_layernorm.bench_shape(s, dtype, copy_gbps, rep, info, device, backend)),
    )
    for shape in shapes:
        for kernel, bench in benches:
            rows = bench(shape)
            p50 = {(r.provider, r.mode): r.ms_p50 for r in rows}
            for r in rows:
                row = dataclasses.asdict(r)
                for ref in ("eager", "compile"):
                    ratio = p50[(ref, r.mode)] / r.ms_p50 if (ref, r.mode) in p50 else None
                    row["speedup_vs_" + ref] = None if ratio is None else float(f"{ratio:.4g}")
                for k in ("baseline", "speedup", "gpu", "torch_version", "triton_version", "tflops"):
                    row.pop(k)
                ctx.record(dict(kind="kernel", **row))
            ctx.record(choice_row(kernel, shape, p50))
            if device == "cuda":
                torch.cuda.empty_cache()


def choice_row(kernel: str, shape: Tuple[int, int, int], p50: Dict[Tuple[str, str], float]) -> dict:
    """What the kernel dispatch serves at ``shape``, forward and backward (``kernel_choice.py``): the
    faster of the fused kernel and torch.compile of its torch path, read from this section's ``full``
    rows of the two (the dispatch's own measurement, once per signature in a run, is the same
    comparison; timing it here again would cost a compilation per shape and kernel)."""
    B, N, D = shape
    triton_ms, compile_ms = p50[("triton", "full")], p50[("compile", "full")]
    ours = min(triton_ms, compile_ms)
    return dict(kind="choice", kernel=kernel, shape=f"B{B} N{N} D{D}",
                provider="compile" if compile_ms < triton_ms else "triton", triton_ms=triton_ms,
                compile_ms=compile_ms, ours_ms=ours, ours_vs_compile=round(compile_ms / ours, 4),
                source="this section's full rows")


# ----------------------------------------------------------------------------------------------
# Section 5: the planner's predictions against measured peaks
# ----------------------------------------------------------------------------------------------

DIT_PLAN_CASES = [("DiT-XL/2", 1, 32, 32, 32), ("DiT-XL/2", 1, 32, 32, 64)]  # (model, frames, h, w, batch)
TOY_WAN = dict(patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
               text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, cross_attn_norm=True,
               qk_norm="rms_norm_across_heads", eps=1e-6)


def section_plan(ctx: Context) -> None:
    import plan_accuracy
    import torch

    if ctx.dry_run:
        ctx.note("CPU: the Wan-shaped case at toy size counts saved tensors; DiT-XL/2's whole-step peak needs "
                 "CUDA's allocator statistics and is left to the GPU run")
        row = plan_accuracy.measure_family("Wan-toy", "WanTransformer3DModel", TOY_WAN, 2, 4, 4, 1, 8, device="cpu")
        ctx.record(dict(kind="activations", **row))
        return
    for case in plan_accuracy.FAMILY_CASES:
        ctx.record(dict(kind="activations", **plan_accuracy.measure_family(*case)))
        torch.cuda.empty_cache()
    for case in DIT_PLAN_CASES:
        ctx.record(dict(kind="step", **plan_accuracy.measure(*case, zero_degree=2)))
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# Section 6: max sequence length with and without checkpointing and offload
# ----------------------------------------------------------------------------------------------

def section_max_seq_len(ctx: Context) -> None:
    import max_seq_len
    import torch

    budget = max(1.0, ctx.remaining() - 5.0)
    if ctx.dry_run:
        ctx.note("CPU: no memory limit to search against; the probes are simulated (each mode fits up to a "
                 "fixed batch) so that the search, the timing and the rows run as on the GPU")
        limits = {"none": 3, "full": 6, "offload": 9}

        def fake(builder, name, size, batch, mode, device, timed_steps):
            if batch > limits[mode]:
                return None
            return max_seq_len.Measurement(tokens=batch * (size // 16) ** 2, step_ms=1.0, peak_bytes=batch * 2**20,
                                           flops=1e9)

        max_seq_len.measure = fake
        torch.cuda.get_device_name = lambda device=None: ctx.stamp()["device"]
        args = dict(model_name="DiT-T/2", size=64, max_batch=16, timed_steps=1, device=torch.device("cpu"))
    else:
        args = dict(model_name="DiT-XL/2", size=256, max_batch=8192, timed_steps=2, device=cuda_device())
    max_seq_len.run(modes=list(max_seq_len.MODES), search="batch", size_range=(256, 16384), time_budget=budget,
                    on_row=ctx.record, **args)


# ----------------------------------------------------------------------------------------------
# Sections 7 and 8 (the second part): Wan 1.3B training against diffusers, Wan 14B LoRA in 24 GiB
# ----------------------------------------------------------------------------------------------

def section_wan_train(ctx: Context) -> None:
    import wan_report

    wan_report.section_train(ctx)


def section_wan_24gb(ctx: Context) -> None:
    import wan_report

    wan_report.section_24gb(ctx)


# ----------------------------------------------------------------------------------------------
# The sections and their time
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Section:
    name: str
    title: str
    cap_s: Optional[float]  # seconds it may take at most with the default budget; None: what is left
    run: Callable[[Context], None]


SECTIONS = [
    Section("tests", "GPU and kernel tests (pytest -m \"gpu or kernels\")", 120.0, section_tests),
    Section("train_bf16", "DiT-XL/2 256 px training step, bf16", 180.0, section_train_bf16),
    Section("train_fp8", "DiT-XL/2 256 px training step, fp8, and fp8 vs bf16 loss", 75.0, section_train_fp8),
    Section("kernels", "Fused kernels against eager, torch.compile and the copy bandwidth", 65.0, section_kernels),
    Section("plan", "Planner: predicted against measured memory", 40.0, section_plan),
    Section("max_seq_len", "Largest step without / with activation checkpointing / with offload", None,
            section_max_seq_len),
    Section("wan_train", "Wan 2.1 1.3B-shaped training step at 480x832: ours against the diffusers loop", 300.0,
            section_wan_train),
    Section("wan_24gb", "Wan 2.1 14B-shaped LoRA step under a 24 GiB cap with the planner's settings, and uncapped",
            None, section_wan_24gb),
]
BY_NAME = {s.name: s for s in SECTIONS}


def allot(section: Section, later: Sequence[Section], remaining: float, banked: float = 0.0) -> float:
    """Seconds for ``section`` with ``remaining`` seconds of budget and the ``later`` sections still to
    run. A capped section gets its cap plus ``banked``, the seconds the earlier capped sections left
    unused, as long as the later sections' caps stay reserved; when the caps do not fit in what
    remains, every capped section gets its proportional share. The uncapped section (the last) gets
    whatever remains once the later caps are reserved (the last section of each part is uncapped)."""
    reserved = sum(s.cap_s for s in later if s.cap_s is not None)
    if section.cap_s is None:  # the later caps kept, or (when they do not fit) an equal share with the later ones
        return max(remaining - reserved, remaining / (1 + len(later)))
    if reserved + section.cap_s > remaining:
        return remaining * section.cap_s / (reserved + section.cap_s)
    return min(section.cap_s + banked, remaining - reserved)


def _section_process(name: str, out_dir: str, dry_run: bool, seconds: float, options: Options = Options()) -> None:
    """The body of a section's process: its own process group (a timeout kills it with everything it
    started), then the section; exit 0 done, EXIT_SKIPPED skipped, 1 failed."""
    os.setpgid(0, 0)
    ctx = Context(out_dir, name, dry_run, time.monotonic() + seconds, options)
    try:
        BY_NAME[name].run(ctx)
    except SectionSkipped as reason:
        ctx.note(f"skipped: {reason}")
        os._exit(EXIT_SKIPPED)
    except BaseException as error:  # noqa: BLE001  (recorded, then the section's process ends)
        traceback.print_exc()
        with contextlib.suppress(Exception):
            ctx.note(f"error: {type(error).__name__}: {' '.join(str(error).split())[:300]}")
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_section(section: Section, out_dir: str, dry_run: bool, seconds: float, start_method: str,
                options: Options = Options()) -> str:
    """Run ``section`` in a new process for at most ``seconds``; its final status."""
    process = multiprocessing.get_context(start_method).Process(
        target=_section_process, args=(section.name, out_dir, dry_run, seconds, options),
        name=f"gpu_report-{section.name}")
    process.start()
    process.join(seconds)
    if process.is_alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.join()
        return "timeout"
    return {0: "ok", EXIT_SKIPPED: "skipped"}.get(process.exitcode, "failed")


def preload() -> None:
    """The dry run forks its sections from this process: import once what every section imports."""
    import warnings

    warnings.filterwarnings("ignore")
    import bench_fused_adaln  # noqa: F401
    import bench_layernorm  # noqa: F401
    import fp8_parity  # noqa: F401
    import max_seq_len  # noqa: F401
    import plan_accuracy  # noqa: F401
    import train_step  # noqa: F401
    import wan_report  # noqa: F401
    from diffusers import WanTransformer3DModel  # noqa: F401

    import opendit_lite.families  # noqa: F401
    import opendit_lite.parallelization  # noqa: F401
    import opendit_lite.plugins  # noqa: F401


def run_report(out_dir: str, budget: float, names: Sequence[str], dry_run: bool, start_method: str,
               options: Options = Options()) -> dict:
    """Every section of ``names`` in order within ``budget`` seconds; returns the final results."""
    import common  # benchmarks/common.py (imports torch)

    os.makedirs(out_dir, exist_ok=True)
    part = options.part
    for stale in result_files(part) + ((PYTEST_LOG,) if "tests" in names else ()):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out_dir, stale))
    chosen = [BY_NAME[n] for n in names]
    doc = dict(schema=SCHEMA_VERSION,
               run=dict(**versions(context=False), python=platform.python_version(), commit=common.git_commit(),
                        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        budget_s=budget, dry_run=dry_run, finished=False, part=part),
               sections=[dict(name=s.name, title=s.title, status="pending", timeout_s=None, seconds=None, notes=[],
                              rows=[]) for s in chosen])
    write_results(out_dir, doc)
    start = time.monotonic()
    end = start + budget
    capped = 0.0  # the caps of the capped sections so far: what they may have used
    for index, section in enumerate(chosen):
        banked = max(0.0, capped - (time.monotonic() - start))
        seconds = allot(section, chosen[index + 1:], end - time.monotonic(), banked)
        capped += section.cap_s or 0.0
        if seconds < (MIN_SECTION_S if not dry_run else 1.0):
            def skip(doc, section=section, seconds=seconds):
                entry = section_entry(doc, section.name)
                entry.update(status="skipped", timeout_s=round(max(seconds, 0.0), 1))
                entry["notes"].append("skipped: no time left in the budget")
            update_results(out_dir, skip, part)
            continue
        print(f"== {section.name}: {section.title} (at most {seconds:.0f} s)", flush=True)
        update_results(out_dir, lambda doc, s=section, t=seconds: section_entry(doc, s.name).update(
            status="running", timeout_s=round(t, 1)), part)
        began = time.monotonic()
        status = run_section(section, out_dir, dry_run, seconds, start_method, options)
        took = round(time.monotonic() - began, 1)

        def done(doc, section=section, status=status, took=took, seconds=seconds):
            entry = section_entry(doc, section.name)
            entry.update(status=status, seconds=took)
            if status == "timeout":
                entry["notes"].append(f"stopped at its timeout ({seconds:.0f} s); the rows above are those "
                                      f"measured before it")
        update_results(out_dir, done, part)
        print(f"== {section.name}: {status} in {took} s", flush=True)
    return update_results(out_dir, lambda doc: doc["run"].update(finished=True), part)


# ----------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------

REQUIRED_ROW_KEYS = {
    ("tests", "tests"): ("passed", "failed", "errors", "skipped", "failing", "finished"),
    ("train_bf16", "throughput"): ("phase", "config", "precision", "batch_per_gpu", "status", "samples_per_s", "mfu",
                                   "peak_alloc_gib", "vs_baseline"),
    ("train_fp8", "throughput"): ("phase", "config", "precision", "batch_per_gpu", "status", "samples_per_s", "mfu",
                                  "peak_alloc_gib", "vs_baseline", "vs_bf16_best"),
    ("train_fp8", "loss"): ("model", "steps", "fp8", "loss_bf16", "loss_fp8", "gap_pct"),
    ("kernels", "copy"): ("gbps",),
    ("kernels", "kernel"): ("kernel", "provider", "mode", "shape", "ms_p50", "gbps", "frac_of_copy_bw",
                            "speedup_vs_eager", "speedup_vs_compile"),
    ("plan", "activations"): ("model", "latent", "predicted_act_gib", "measured_gib", "act_ratio"),
    ("plan", "step"): ("model", "latent", "batch", "predicted_gib", "measured_peak_gib", "ratio"),
    ("max_seq_len", "max"): ("mode", "size", "batch", "tokens", "max_is_lower_bound"),
    ("max_seq_len", "timed"): ("mode", "size", "batch", "tokens", "step_ms", "peak_gib"),
    ("kernels", "choice"): ("kernel", "shape", "provider", "triton_ms", "compile_ms", "ours_ms", "ours_vs_compile",
                            "source"),
    ("wan_train", "wan_step"): ("model", "clip", "tokens", "mode", "impl", "settings", "step_ms", "tokens_per_s",
                                "tflops", "mfu", "peak_gib", "vs_diffusers"),
    ("wan_24gb", "lora_24gb"): ("model", "case", "cap_gib", "blocks_to_swap", "base_precision", "selective_ratio",
                                "ac_offload", "predicted_gib", "status"),
}


def check_schema(doc: dict, out_dir: Optional[str] = None) -> List[str]:
    """What is wrong with a results document (and, given ``out_dir``, with the files beside it); [] when nothing."""
    problems = []
    if doc.get("schema") != SCHEMA_VERSION:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA_VERSION}")
    run = doc.get("run", {})
    for key in STAMP + ("python", "commit", "date", "budget_s", "dry_run", "finished"):
        if key not in run:
            problems.append(f"run: no {key!r}")
    for section in doc.get("sections", []):
        name = section.get("name")
        if name not in BY_NAME:
            problems.append(f"unknown section {name!r}")
            continue
        if section.get("status") not in STATUSES:
            problems.append(f"{name}: status {section.get('status')!r} is not one of {', '.join(STATUSES)}")
        if not isinstance(section.get("notes"), list) or not isinstance(section.get("rows"), list):
            problems.append(f"{name}: notes and rows must be lists")
            continue
        for i, row in enumerate(section["rows"]):
            missing = [k for k in STAMP if not row.get(k)]
            kind = row.get("kind")
            required = REQUIRED_ROW_KEYS.get((name, kind))
            if required is None:
                problems.append(f"{name} row {i}: unknown kind {kind!r}")
                continue
            missing += [k for k in required if k not in row]
            if missing:
                problems.append(f"{name} row {i} ({kind}): no {', '.join(missing)}")
    if out_dir is not None:
        results_name, summary_name = result_files(run.get("part", "dit"))
        summary = os.path.join(out_dir, summary_name)
        if not os.path.isfile(summary):
            problems.append(f"no {summary_name} beside {results_name}")
        else:
            with open(summary) as f:
                text = f.read()
            problems += [f"{summary_name} does not mention section {s['name']}" for s in doc.get("sections", [])
                         if f"`{s['name']}`" not in text]
        if any(s["name"] == "tests" and s["status"] not in ("pending", "skipped") for s in doc.get("sections", [])) \
                and not os.path.isfile(os.path.join(out_dir, PYTEST_LOG)):
            problems.append(f"the tests section ran but left no {PYTEST_LOG}")
    return problems


# ----------------------------------------------------------------------------------------------
# summary.md and the README's table
# ----------------------------------------------------------------------------------------------

# Columns shown in summary.md per (section, row kind); the rest stays in results.json.
SUMMARY_COLUMNS = {
    "tests": ("passed", "failed", "errors", "skipped", "finished", "pytest_exit", "failing", "collection_errors"),
    "throughput": ("phase", "config", "precision", "batch_per_gpu", "status", "samples_per_s", "vs_baseline",
                   "vs_bf16_best", "tflops_per_gpu", "mfu", "peak_alloc_gib", "step_ms_median"),
    "loss": ("model", "image_size", "batch", "steps", "fp8", "loss_bf16", "loss_fp8", "gap_pct", "target_pct",
             "step_ms_bf16", "step_ms_fp8"),
    "copy": ("kernel", "gbps"),
    "kernel": ("kernel", "shape", "mode", "ms_p50", "gbps", "frac_of_copy_bw", "speedup_vs_eager",
               "speedup_vs_compile", "peak_mem_mib", "timer"),
    "activations": ("model", "latent", "batch", "caption", "predicted_act_gib", "measured_gib", "act_ratio"),
    "step": ("model", "latent", "batch", "zero_degree", "predicted_gib", "measured_peak_gib", "ratio",
             "predicted_act_gib", "measured_forward_growth_gib", "act_ratio"),
    "max": ("mode", "size", "batch", "tokens", "max_is_lower_bound"),
    "timed": ("mode", "size", "batch", "tokens", "is_max", "step_ms", "tflops", "mfu", "peak_gib"),
    "choice": ("kernel", "shape", "provider", "triton_ms", "compile_ms", "ours_vs_compile", "source"),
    "wan_step": ("clip", "tokens", "mode", "impl", "checkpointed", "step_ms", "tokens_per_s", "tflops", "mfu",
                 "peak_gib", "vs_diffusers"),
    "lora_24gb": ("case", "cap_gib", "blocks_to_swap", "base_precision", "selective_ratio", "ac_offload", "status",
                  "predicted_gib", "peak_gib", "predicted_over_measured", "step_s", "capped_over_uncapped_time"),
}


def cell(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "<br>".join(f"`{v}`" for v in value) if value else "-"
    return str(value).replace("|", "/")


def markdown_table(rows: List[dict], columns: Sequence[str]) -> List[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return lines


def render_summary(doc: dict) -> str:
    run = doc["run"]
    lines = [f"# GPU report{' (dry run on the CPU: toy sizes, the numbers mean nothing)' if run['dry_run'] else ''}",
             "",
             f"{run['device']}, torch {run['torch']}, triton {run['triton']}, Python {run['python']}, "
             f"commit {run['commit']}, {run['date']}, budget {run['budget_s']:.0f} s"
             f"{'' if run['finished'] else ' (in progress, or cut short: the rows below are what was measured)'}",
             *([f"({run['commit_note']})"] if run.get("commit_note") else []),
             "",
             "| section | status | seconds | timeout (s) | rows |", "|---|---|---:|---:|---:|"]
    for s in doc["sections"]:
        lines.append(f"| `{s['name']}` | {s['status']} | {cell(s['seconds'])} | {cell(s['timeout_s'])} | "
                     f"{len(s['rows'])} |")
    for s in doc["sections"]:
        lines += ["", f"## `{s['name']}`: {BY_NAME[s['name']].title if s['name'] in BY_NAME else s.get('title')}",
                  "", f"Status: {s['status']}."]
        lines += [f"- {n}" for n in s["notes"]]
        kinds = list(dict.fromkeys(r.get("kind") for r in s["rows"]))
        for kind in kinds:
            rows = [r for r in s["rows"] if r.get("kind") == kind]
            if kind == "kernel":  # ours only here; the eager and compile rows are in results.json
                rows = [r for r in rows if r.get("provider") == "triton"]
            columns = SUMMARY_COLUMNS.get(kind) or [k for k in rows[0] if k not in STAMP + ("kind",)]
            lines += [""] + markdown_table(rows, columns)
    return "\n".join(lines) + "\n"


README_BEGIN = "<!-- gpu-report: generated by `python benchmarks/gpu_report.py --readme-table --write`; do not edit -->"
README_END = "<!-- /gpu-report -->"


def readme_table(doc: Optional[dict]) -> str:
    """The README's performance block, from a results document (None or a dry run: says none exists)."""
    if doc is None or doc["run"].get("dry_run"):
        return ("No GPU results are committed yet: `benchmarks/results/results.json` is written by the first "
                "`make gpu-report` on a GPU machine (docs/gpu.md), and this block is generated from it.\n")
    run = doc["run"]
    sections = {s["name"]: s for s in doc["sections"]}
    lines = [f"Measured by `make gpu-report` on {run['device']} (torch {run['torch']}, triton {run['triton']}, "
             f"commit {run['commit']}, {run['date']}); every number comes from `benchmarks/results/results.json`."
             + (f" ({run['commit_note']}.)" if run.get("commit_note") else ""),
             ""]
    tests = [r for r in sections.get("tests", {}).get("rows", []) if r.get("kind") == "tests"]
    if tests:
        t = tests[-1]
        lines += [f"GPU and kernel tests: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
                  f"{t['skipped']} skipped.", ""]
    steps = [r for name in ("train_bf16", "train_fp8") for r in sections.get(name, {}).get("rows", [])
             if r.get("kind") == "throughput"]
    if steps:
        lines += markdown_table([dict(r, mfu=None if r.get("mfu") in ("", None) else round(100 * r["mfu"], 1))
                                 for r in steps],
                                ("config", "precision", "batch_per_gpu", "samples_per_s", "vs_baseline", "mfu",
                                 "peak_alloc_gib"))
        lines += ["", "(`vs_baseline`: over the plain loop with bf16 autocast and torch.compile at batch "
                  f"{GPU_STEP.batch}, same run; `mfu` in %.)", ""]
    loss = [r for r in sections.get("train_fp8", {}).get("rows", []) if r.get("kind") == "loss"]
    if loss:
        r = loss[-1]
        lines += [f"fp8 against bf16 after {r['steps']} steps ({r['model']}): loss {r['loss_fp8']} against "
                  f"{r['loss_bf16']} ({r['gap_pct']:+.2f}%).", ""]
    kernels = [r for r in sections.get("kernels", {}).get("rows", [])
               if r.get("kind") == "kernel" and r.get("provider") == "triton" and r.get("mode") == "full"]
    if kernels:
        lines += markdown_table(kernels, ("kernel", "shape", "gbps", "frac_of_copy_bw", "speedup_vs_eager",
                                          "speedup_vs_compile"))
        lines += ["", "(forward + backward; `frac_of_copy_bw`: of the device-to-device copy bandwidth measured in "
                  "the same run.)", ""]
    plan = sections.get("plan", {}).get("rows", [])
    if plan:
        lines += markdown_table([dict(r, predicted=r.get("predicted_gib", r.get("predicted_act_gib")),
                                      measured=r.get("measured_peak_gib", r.get("measured_gib")),
                                      predicted_over_measured=r.get("ratio", r.get("act_ratio"))) for r in plan],
                                ("model", "kind", "latent", "batch", "predicted", "measured",
                                 "predicted_over_measured"))
        lines += ["", "(planner, GiB: `step` the whole ZeRO-2 step's peak, `activations` one forward's growth.)", ""]
    maxima = [r for r in sections.get("max_seq_len", {}).get("rows", []) if r.get("kind") == "max"]
    if maxima:
        lines += markdown_table(maxima, ("model", "mode", "batch", "tokens", "max_is_lower_bound")) + [""]
    choices = [r for r in sections.get("kernels", {}).get("rows", []) if r.get("kind") == "choice"]
    if choices:
        lines += markdown_table(choices, ("kernel", "shape", "provider", "triton_ms", "compile_ms", "ours_vs_compile"))
        lines += ["", "(what the kernel dispatch serves at each shape, forward + backward: the fused kernel or "
                  "torch.compile of its torch path, whichever it measured faster; `ours_vs_compile` >= 1 by "
                  "construction.)", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def wan_readme_table(doc: Optional[dict]) -> str:
    """The README's Wan rows, from the second part's results (None or a dry run: says none exists)."""
    if doc is None or doc["run"].get("dry_run"):
        return ("No Wan results are committed yet: `benchmarks/results/results_wan.json` is written by "
                "`make gpu-report GPU_REPORT_ARGS=\"--part wan\"` on a GPU machine (docs/gpu.md).\n")
    run = doc["run"]
    sections = {s["name"]: s for s in doc["sections"]}
    lines = [f"Wan, measured by `make gpu-report` (`--part wan`) on {run['device']} (torch {run['torch']}, commit "
             f"{run['commit']}, {run['date']}); every number comes from `benchmarks/results/results_wan.json`.", ""]
    steps = [r for r in sections.get("wan_train", {}).get("rows", []) if r.get("kind") == "wan_step"]
    if steps:
        lines += markdown_table([dict(r, mfu=None if r.get("mfu") in ("", None) else round(100 * r["mfu"], 1))
                                 for r in steps],
                                ("clip", "tokens", "mode", "impl", "checkpointed", "step_ms", "tokens_per_s", "mfu",
                                 "peak_gib", "vs_diffusers"))
        lines += ["", "(Wan 2.1 1.3B-shaped transformer, batch 1, 512 caption tokens; `impl` diffusers: bf16, "
                  "SDPA, compile_repeated_blocks, AdamW; ours: fused kernels, compile, ZeRO-2; `mfu` in %, "
                  "attention counted; `vs_diffusers`: its step time over ours, same run.)", ""]
    lora = [r for r in sections.get("wan_24gb", {}).get("rows", []) if r.get("kind") == "lora_24gb"]
    if lora:
        lines += markdown_table(lora, ("case", "blocks_to_swap", "base_precision", "selective_ratio", "ac_offload",
                                       "status", "predicted_gib", "peak_gib", "step_s", "capped_over_uncapped_time"))
        lines += ["", "(Wan 2.1 14B-shaped LoRA step, 21x80x80 latents (the tokens of 81 frames at 480x832), with the "
                  "planner's settings for 24 GiB "
                  "under a 24 GiB cap, and for the whole device uncapped; GiB allocated.)", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def readme_block(doc: Optional[dict], wan: Optional[dict] = None) -> str:
    return f"{README_BEGIN}\n{readme_table(doc)}\n{wan_readme_table(wan)}{README_END}"


def committed_results(part: str = "dit") -> Optional[dict]:
    return load_results(RESULTS_DIR, part) if os.path.isfile(os.path.join(RESULTS_DIR, result_files(part)[0])) \
        else None


def write_readme(path: str) -> bool:
    """Replace the README's generated block; True when it changed."""
    with open(path) as f:
        text = f.read()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"error: {path} has no generated block ({README_BEGIN} ... {README_END}) to replace")
    new = text[:begin] + readme_block(committed_results(), committed_results("wan")) + text[end + len(README_END):]
    if new != text:
        with open(path, "w") as f:
            f.write(new)
    return new != text


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, help="seconds for all sections together (default 480; dry run 300)")
    parser.add_argument("--part", choices=(*PARTS, "all"),
                        help="which part of the report: dit (sections " + ", ".join(PARTS["dit"]) + "; the default on "
                             "the GPU) or wan (" + ", ".join(PARTS["wan"]) + "), one 10-minute command each, each "
                             "with its own files; all: both (the dry run's default)")
    parser.add_argument("--only", nargs="+", choices=list(BY_NAME), metavar="SECTION",
                        help=f"run these sections of the part only, in priority order ({', '.join(BY_NAME)})")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU at toy sizes, then check the files' schema (a test runs this)")
    parser.add_argument("--out", help="output folder (default: $OUT, else benchmarks/results/; dry run: "
                                      "outputs/gpu_report_dry_run/)")
    parser.add_argument("--start-method", choices=("spawn", "fork"),
                        help="how a section's process starts (default: spawn on the GPU, a fresh interpreter; fork "
                             "in the dry run, which imports everything once)")
    parser.add_argument("--readme-table", action="store_true",
                        help="print the README's performance block from benchmarks/results/results.json")
    parser.add_argument("--write", metavar="README", nargs="?", const=os.path.join(ROOT, "README.md"),
                        help="with --readme-table: replace the generated block in README.md (or this file)")
    narrow = parser.add_argument_group("a shorter run (e.g. a rerun after fixes)")
    narrow.add_argument("--tests", nargs="+", metavar="TEST", default=(),
                        help="tests: these pytest ids or paths (still under -m \"gpu or kernels\") instead of every "
                             "GPU and kernel test file")
    narrow.add_argument("--kernel-shapes", nargs="+", metavar="BxNxD", type=kernel_shape, default=(),
                        help="kernels: these shapes instead of the report's five, e.g. 128x256x1152 1x65536x1152")
    narrow.add_argument("--no-batch-search", dest="batch_search", action="store_false",
                        help="train_bf16: the baseline and the best configuration at batch 128 only")
    narrow.add_argument("--wan-frames", nargs="+", type=int, choices=(33, 81), default=(),
                        help="wan_train: these clips only (frames at 480x832) instead of 33 and 81")
    narrow.add_argument("--train-steps", nargs=2, type=int, metavar=("WARMUP", "STEPS"),
                        help=f"train_bf16 and train_fp8: warm-up and timed steps (default {GPU_STEP.warmup} "
                             f"{GPU_STEP.steps})")
    args = parser.parse_args(argv)
    args.part = args.part or ("all" if args.dry_run else "dit")
    if args.only:
        outside = [n for n in args.only if n not in part_sections(args.part)]
        if outside:
            parser.error(f"--only {' '.join(outside)}: not in --part {args.part} "
                         f"({', '.join(part_sections(args.part))}); name the part that holds them")
    if args.budget is not None and args.budget <= 0:
        parser.error("--budget must be > 0 seconds")
    if args.train_steps is not None and (args.train_steps[0] < 1 or args.train_steps[1] < 1):
        parser.error("--train-steps needs at least 1 warm-up step (compilation) and 1 timed step")
    return args


def kernel_shape(text: str) -> Tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape BxNxD of three positive integers, e.g. 128x256x1152")
    return tuple(int(p) for p in parts)


def part_sections(part: str) -> Tuple[str, ...]:
    return tuple(n for p in PARTS.values() for n in p) if part == "all" else PARTS[part]


def options_from(args: argparse.Namespace) -> Options:
    return Options(tests=tuple(args.tests), kernel_shapes=tuple(args.kernel_shapes), batch_search=args.batch_search,
                   train_steps=tuple(args.train_steps) if args.train_steps else None, part=args.part,
                   wan_frames=tuple(args.wan_frames))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.readme_table:
        if args.write:
            print(("rewrote the generated block of " if write_readme(args.write) else "up to date: ") + args.write)
        else:
            print(readme_block(committed_results(), committed_results("wan")))
        return 0
    if args.dry_run:  # the Triton kernels in Triton's interpreter, set before opendit_lite.kernels is imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("error: gpu_report.py measures a CUDA GPU and none is visible (torch.cuda.is_available() is False). "
              "Run it on the GPU machine (docs/gpu.md); here, `python benchmarks/gpu_report.py --dry-run` runs every "
              "section at toy sizes on the CPU.", file=sys.stderr)
        return 2
    out_dir = args.out or (DRY_RUN_DIR if args.dry_run else os.environ.get("OUT") or RESULTS_DIR)
    chosen = part_sections(args.part)
    # the dry run's sections end long before; "all" on the GPU is both parts' budgets (two commands' worth)
    budget = args.budget or (300.0 if args.dry_run else PART_BUDGET_S * (len(PARTS) if args.part == "all" else 1))
    names = [s.name for s in SECTIONS if s.name in chosen and (not args.only or s.name in args.only)]
    start_method = args.start_method or ("fork" if args.dry_run else "spawn")
    if args.dry_run and start_method == "fork":
        preload()
    started = time.monotonic()
    doc = run_report(out_dir, budget, names, args.dry_run, start_method, options_from(args))
    problems = check_schema(doc, out_dir)
    statuses = {s["name"]: s["status"] for s in doc["sections"]}
    print(f"{len(names)} sections in {time.monotonic() - started:.0f} s: "
          + ", ".join(f"{n} {s}" for n, s in statuses.items()))
    print("wrote " + ", ".join(os.path.join(out_dir, name) for name in result_files(args.part)))
    for problem in problems:
        print(f"schema: {problem}", file=sys.stderr)
    return 0 if not problems and all(s == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
