"""benchmarks/max_seq_len.py is GPU-only; on CPU its command line, search, input builders and
reporting are checked without running a step."""

import importlib.util
import os
import sys
import types

import pytest
import torch

from tests.script_server import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "max_seq_len.py")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, os.path.dirname(SCRIPT))  # the script imports its sibling flops.py
    spec = importlib.util.spec_from_file_location("max_seq_len", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_runs_without_a_gpu():
    out = run_script([SCRIPT, "--help"], cwd=os.getcwd(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--model" in out.stdout and "offload" in out.stdout


def test_dit_input_builder(bench):
    builder = bench.input_builder_for("DiT-T/2")
    assert builder.unit == "resolution" and builder.granularity("DiT-T/2") == 16
    assert builder.default_size == 256
    trial = builder.build("DiT-T/2", 64, 3)  # 8x8 latent, 2x2 patches -> 16 tokens per image, batch 3
    assert trial.tokens == 3 * 16
    x, t, y = trial.inputs
    assert x.shape == (3, 4, 8, 8) and t.shape == y.shape == (3,)
    assert trial.model(x, t, y).shape[-2:] == (8, 8)
    assert trial.flops == 3 * 3 * bench.dit_forward_flops(trial.model)  # batch x (forward + 2x backward)


def test_unknown_family_and_duplicate_builder(bench):
    with pytest.raises(KeyError, match="no input builder.*register_input_builder"):
        bench.input_builder_for("Unknown-XL/2")
    with pytest.raises(ValueError, match="already registered"):
        bench.register_input_builder("DiT", "resolution", lambda n: 16, (256, 512), 256)(lambda n, s, b: None)


def _fake_measure(bench, limits, timed, key):
    """A stand-in for measure(): fits while the searched value (``key``: "size" or "batch") is
    within the mode's limit; 16 x 16 latent patches per 256 px image."""

    def fake(builder, name, size, batch, mode, device, timed_steps):
        if timed_steps:
            timed.append((mode, size if key == "size" else batch))
        if (size if key == "size" else batch) > limits[mode]:
            return None
        tokens = batch * (size // 16) ** 2
        return bench.Measurement(tokens=tokens, step_ms=tokens / 100, peak_bytes=2 ** 30, flops=1e12)

    return fake


def test_batch_search_finds_each_mode_and_times_it_at_every_maximum(bench, monkeypatch):
    limits = {"none": 24, "full": 100, "offload": 150}  # largest batch each mode fits
    timed = []
    monkeypatch.setattr(bench, "measure", _fake_measure(bench, limits, timed, "batch"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake H100")
    rows = bench.run("DiT-T/2", list(limits), "batch", (256, 2048), 256, 4096, timed_steps=2,
                     device=torch.device("cpu"))
    assert {r["mode"]: r["batch"] for r in rows if r["is_max"]} == limits
    assert all(r["size"] == 256 and not r["max_is_lower_bound"] for r in rows)
    # each mode timed at every mode's maximum it fits: offload's overhead is read where full checkpointing stops
    assert timed == [("none", 24), ("full", 24), ("full", 100), ("offload", 24), ("offload", 100), ("offload", 150)]
    assert rows[0]["tokens"] == 24 * 256
    assert "offload vs full checkpointing: 1.50x tokens, +0.0% step time at 25600 tokens" in bench.summarize(rows)


def test_size_search_is_still_available(bench, monkeypatch):
    limits = {"none": 512, "full": 1024}  # largest resolution each mode fits
    timed = []
    monkeypatch.setattr(bench, "measure", _fake_measure(bench, limits, timed, "size"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake H100")
    rows = bench.run("DiT-T/2", list(limits), "size", (256, 2048), 256, 4096, timed_steps=2, device=torch.device("cpu"))
    assert {r["mode"]: r["size"] for r in rows if r["is_max"]} == limits
    assert all(r["batch"] == 1 for r in rows)


def test_time_budget_bounds_the_search_and_the_timing(bench, monkeypatch):
    clock = [0.0]
    # the scripts' shared Deadline reads common.time.monotonic: a fake clock advanced by the probes
    monkeypatch.setattr(sys.modules["common"], "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def slow_measure(builder, name, size, batch, mode, device, timed_steps):
        clock[0] += 10.0  # every probe or timing costs 10 s
        return bench.Measurement(tokens=batch * 256, step_ms=1.0, peak_bytes=0, flops=1e12)

    monkeypatch.setattr(bench, "measure", slow_measure)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake H100")
    # 100 s: 70 s of search for two modes (35 s each: 4 probes), the timing stops at 100 s
    rows = bench.run("DiT-T/2", ["full", "offload"], "batch", (256, 2048), 256, 4096, timed_steps=1,
                     device=torch.device("cpu"), time_budget=100.0)
    assert clock[0] <= 100.0 + 10.0
    maxima = {r["mode"]: r for r in rows if r["is_max"]}
    assert maxima and all(r["max_is_lower_bound"] for r in maxima.values())
    assert "or more (time budget spent)" in bench.summarize(rows)


def test_summary_and_results_files(bench, tmp_path):
    def row(mode, size, tokens, is_max, ms):
        return dict(model="DiT-T/2", mode=mode, unit="resolution", size=size, batch=1, tokens=tokens, is_max=is_max,
                    max_is_lower_bound=False, step_ms=ms, tflops=1.0, mfu="", peak_gib=1.0, device="Fake GPU",
                    torch=torch.__version__)

    rows = [row("none", 256, 256, True, 10.0), row("full", 256, 256, False, 12.0),
            row("full", 512, 1024, True, 50.0), row("offload", 512, 1024, False, 55.0),
            row("offload", 640, 1600, True, 90.0)]
    text = bench.summarize(rows)
    assert "offload vs full checkpointing: 1.56x tokens, +10.0% step time at 1024 tokens" in text
    csv_path, png_path = bench.write_results(rows, str(tmp_path), "DiT-T/2")
    assert os.path.basename(csv_path) == "max_seq_len_DiT_T_2_Fake_GPU.csv"
    assert open(csv_path).read().count("\n") == len(rows) + 1 and os.path.getsize(png_path) > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_main_without_gpu_says_so(bench):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench.main(["--model", "DiT-T/2"])
