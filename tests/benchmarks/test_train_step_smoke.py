"""benchmarks/train_step.py and benchmarks/flops.py on the CPU: the FLOP formula against the DiT
paper and against torch's FLOP counter, configuration names, the batch search and its
out-of-memory path, and one smoke run of the script (no timing assertions)."""

import csv
import dataclasses
import importlib
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_DIR = os.path.join(ROOT, "benchmarks")
SCRIPT = os.path.join(BENCH_DIR, "train_step.py")


@pytest.fixture(scope="module")
def bench():
    """train_step and flops as the script sees them (benchmarks/ on the path, as for `python benchmarks/...`)."""
    if BENCH_DIR not in sys.path:
        sys.path.insert(0, BENCH_DIR)
    return importlib.import_module("train_step"), importlib.import_module("flops")


# Table 4 of the DiT paper: forward "Gflops" (multiply-adds) per 256 px image (32 x 32 latents).
PAPER_GMACS = {
    "DiT-S/8": 0.36, "DiT-S/4": 1.41, "DiT-S/2": 6.06,
    "DiT-B/8": 1.42, "DiT-B/4": 5.56, "DiT-B/2": 23.01,
    "DiT-L/8": 5.01, "DiT-L/4": 19.70, "DiT-L/2": 80.71,
    "DiT-XL/8": 7.39, "DiT-XL/4": 29.05, "DiT-XL/2": 118.64,
}


@pytest.mark.parametrize("name", list(PAPER_GMACS))
def test_dit_flops_match_the_paper(bench, name):
    from opendit_lite.models.dit import DIT_SIZES

    _, flops = bench
    depth, hidden, _heads = DIT_SIZES[name.split("-")[1].split("/")[0]]
    patch = int(name.rsplit("/", 1)[1])
    macs = flops.dit_forward_macs(depth=depth, hidden_size=hidden, num_tokens=(32 // patch) ** 2, patch_size=patch,
                                  in_channels=4, out_channels=8, mlp_hidden=4 * hidden)
    assert macs / 1e9 == pytest.approx(PAPER_GMACS[name], rel=2e-3, abs=5e-3)


def test_dit_flops_match_torch_flop_counter(bench):
    """torch's count of every matmul in a real forward equals the formula exactly; its backward is
    twice the forward to within 1%, not exactly: the first layers skip the input gradient (the
    latents and timestep features need none) and the CPU flash backward recomputes the scores."""
    from torch.utils.flop_counter import FlopCounterMode

    from opendit_lite.models import build_model

    _, flops = bench
    torch.manual_seed(0)
    model = build_model("DiT-T/2", input_size=(8, 6), num_classes=10)  # non-square: 4 x 3 = 12 tokens
    x, t, y = torch.randn(3, 4, 8, 6), torch.randint(0, 1000, (3,)), torch.randint(0, 10, (3,))
    with FlopCounterMode(display=False) as forward:
        out = model(x, t, y)
    with FlopCounterMode(display=False) as backward:
        out.square().mean().backward()
    per_sample = flops.dit_forward_flops(model)
    assert forward.get_total_flops() == 3 * per_sample
    counted = forward.get_total_flops() + backward.get_total_flops()
    assert counted == pytest.approx(3 * flops.train_flops(per_sample), rel=0.01)


def test_device_peak_lookup(bench):
    _, flops = bench
    assert flops.device_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert flops.device_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert flops.device_peak_tflops("NVIDIA H200") == 989.0
    assert flops.device_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert flops.device_peak_tflops("CPU x86_64") is None
    assert flops.mfu(494.5, 989.0) == pytest.approx(0.5) and flops.mfu(1.0, None) is None


def test_config_names(bench):
    train_step, _ = bench
    base = train_step.parse_config("torch-bf16-compile", "fp32")
    assert base.baseline and base.compile and base.precision == "bf16"
    cfg = train_step.parse_config("zero2+kernels+compile+ac0.25+offload", "bf16")
    assert (cfg.zero_degree, cfg.kernels, cfg.compile, cfg.selective_ratio, cfg.offload) == (2, True, True, 0.25, True)
    assert train_step.parse_config("zero0+ac", "bf16").selective_ratio == 0.0
    for bad, message in [("zero4", "unknown configuration"), ("zero1+fast", "unknown option"),
                         ("zero1+offload", "add \\+ac"), ("zero1+ac1.5", "in \\[0, 1\\)")]:
        with pytest.raises(ValueError, match=message):
            train_step.parse_config(bad, "bf16")
    for name in train_step.DEFAULT_CONFIGS:
        train_step.parse_config(name, "bf16")


@pytest.mark.parametrize("threshold", [1, 2, 3, 7, 8, 50, 64])
def test_largest_fitting(bench, threshold):
    train_step, _ = bench
    probes = []

    def fits(k):
        probes.append(k)
        return k <= threshold

    assert train_step.largest_fitting(fits, 1, 64) == threshold
    assert len(probes) <= 2 * 6 + 2
    assert train_step.largest_fitting(lambda k: False, 1, 64) is None


def test_largest_fitting_stops_when_out_of_time(bench):
    train_step, _ = bench
    probes = []

    def fits(k):
        probes.append(k)
        return k <= 50

    # the budget runs out after three probes: the largest batch known to fit is returned
    assert train_step.largest_fitting(fits, 1, 64, out_of_time=lambda: len(probes) >= 3) == 4
    assert probes == [1, 2, 4]


class _OomAbove(nn.Module):
    """A linear layer that raises CUDA's out-of-memory error for batches above ``limit``."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.linear(x)


def test_batch_search_and_out_of_memory_path(bench):
    """Out-of-memory steps count as "does not fit"; other errors propagate."""
    train_step, _ = bench
    workload = train_step.Workload(
        build_model=lambda: _OomAbove(limit=13),
        make_batch=lambda b, device: dict(x=torch.randn(b, 4, device=device)),
        loss=lambda model, batch: model(batch["x"]).square().mean(),
        tokens_per_sample=lambda model: 1,
        forward_flops_per_sample=lambda model: 32.0,
    )
    args = train_step.parse_args(["--device", "cpu", "--batch-multiple", "2", "--max-batch", "40"])
    config = train_step.parse_config("torch-fp32", "bf16")
    device = torch.device("cpu")
    assert train_step.try_measure(config, workload, 14, 1, 1, device, args) is None
    m = train_step.try_measure(config, workload, 12, 1, 2, device, args)
    assert len(m.step_ms) == 2 and m.forward_flops_per_sample == 32.0 and m.peak_alloc_bytes is None
    assert train_step.search_batch(config, workload, device, args) == 12
    spent = train_step.common.Deadline(1e-9)  # a budget already spent: only the first probe runs
    assert train_step.search_batch(config, workload, device, args, spent) == 2

    def broken(model, batch):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        train_step.try_measure(config, dataclasses.replace(workload, loss=broken), 2, 1, 1, device, args)


@pytest.mark.slow
def test_smoke_run(tmp_path):
    """The script end to end on the CPU: plain baseline and plugin zero 0, fp32, tiny DiT, plus a profile."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")  # tiny shapes: threads only contend
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(key, None)  # a world of one, whatever launched pytest
    cmd = [sys.executable, SCRIPT, "--model", "DiT-T/2", "--image-size", "32", "--num-classes", "10",
           "--device", "cpu", "--precision", "fp32", "--batch-size", "2", "--warmup-steps", "2", "--steps", "2",
           "--configs", "torch-fp32", "zero0", "--profile", "zero0", "--profile-steps", "1", "--profile-top", "5",
           "--peak-tflops", "1.0", "--out-dir", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    files = sorted(p.name for p in tmp_path.iterdir())
    csv_path = next(tmp_path.glob("train_step_DiT_T_2_*.csv"))
    assert csv_path.with_suffix(".png").stat().st_size > 0, files
    assert "| zero0 | 2 |" in csv_path.with_suffix(".md").read_text()
    profile = next(tmp_path.glob("train_step_profile_zero0_DiT_T_2_*.md")).read_text()
    assert "| 1 | `" in profile and "CPU time per step" in profile

    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [r["config"] for r in rows] == ["torch-fp32", "zero0"]
    for r in rows:
        assert r["status"] == "ok", r
        samples = float(r["samples_per_s"])
        assert samples > 0 and float(r["step_ms_median"]) > 0
        assert float(r["tokens_per_s"]) == pytest.approx(samples * 4, rel=1e-3)  # (32/8/2)^2 = 4 tokens
        assert float(r["tflops_per_gpu"]) > 0 and float(r["mfu"]) == pytest.approx(float(r["tflops_per_gpu"]), rel=1e-3)
        assert r["batch_per_gpu"] == "2" and r["world_size"] == "1" and r["commit"] and r["date"]
    assert float(rows[0]["speedup_vs_torch_fp32"]) == 1.0
    assert rows[1]["speedup_vs_torch_fp32"] != "" and rows[1]["speedup_vs_torch_bf16_compile"] == ""


def test_config_run_reuses_compiled_graphs_across_batch_sizes(bench):
    """A batch search compiles each graph at most twice (static, then a symbolic batch dimension),
    and the rebuild after an out-of-memory step compiles nothing new."""
    from torch._dynamo.utils import counters

    train_step, _ = bench
    torch._dynamo.reset()
    counters.clear()
    workload = train_step.build_workload("DiT-T/2", 16, 10)
    args = train_step.parse_args(["--device", "cpu", "--compile-backend", "eager"])
    config = train_step.BenchConfig("fp32-compile", baseline=True, precision="fp32", compile=True)
    run = train_step.ConfigRun(config, workload, torch.device("cpu"), args)
    try:
        run.measure(2, warmup_steps=1, steps=1)
        first = counters["stats"]["unique_graphs"]
        for batch in (4, 6):
            run.measure(batch, warmup_steps=1, steps=1)
        after = counters["stats"]["unique_graphs"]
        assert 1 <= first and after <= 2 * first
        run.trainer = None  # what an out-of-memory step leaves: the next batch rebuilds the trainer
        assert run.measure(8, warmup_steps=1, steps=1) is not None
        assert counters["stats"]["unique_graphs"] == after and run.builds == 2
    finally:
        run.close()


def test_rows_are_written_after_every_configuration(bench, tmp_path, monkeypatch):
    """A run cut while measuring its second configuration keeps the first one's row on disk."""
    import opendit_lite.distributed.process_group as process_group

    train_step, _ = bench
    monkeypatch.setattr(process_group, "init_distributed",
                        lambda: process_group.DistInfo(0, 1, 0, 1, torch.device("cpu")))
    monkeypatch.setattr(process_group, "cleanup_distributed", lambda: None)
    measured = []

    def timed_row(run, info, batch, warmup_steps, steps):
        measured.append(run.config.name)
        if len(measured) == 2:
            raise KeyboardInterrupt  # the run is cut here
        return train_step.row_for(run.config, info, batch, "ok", train_step.Measurement([10.0], 4, 1e6, None, None))

    monkeypatch.setattr(train_step, "timed_row", timed_row)
    with pytest.raises(KeyboardInterrupt):
        train_step.main(["--model", "DiT-T/2", "--image-size", "32", "--num-classes", "10", "--device", "cpu",
                         "--configs", "torch-fp32", "zero0", "--peak-tflops", "1", "--out-dir", str(tmp_path)])
    with open(next(tmp_path.glob("train_step_DiT_T_2_*.csv"))) as f:
        rows = list(csv.DictReader(f))
    assert [r["config"] for r in rows] == ["torch-fp32"] and rows[0]["samples_per_s"] == "3200.0"  # batch 32 in 10 ms
    assert "| torch-fp32 | 32 |" in next(tmp_path.glob("train_step_DiT_T_2_*.md")).read_text()


def test_fp8_precision_is_refused_on_the_cpu_with_exit_code_2(bench, capsys):
    train_step, _ = bench
    with pytest.raises(SystemExit) as exit:
        train_step.parse_args(["--device", "cpu", "--precision", "fp8"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "--precision fp8" in err and "needs a CUDA GPU with FP8 tensor cores" in err
    assert train_step.parse_config("zero0+kernels+compile", "fp8").precision == "fp8"
