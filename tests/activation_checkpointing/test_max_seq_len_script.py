"""benchmarks/max_seq_len.py is GPU-only; on CPU its command line, search, input builders and
reporting are checked without running a step."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

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
    out = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--model" in out.stdout and "offload" in out.stdout


@pytest.mark.parametrize("threshold", [3, 4, 10, 17, 64])
def test_largest_fitting_finds_the_threshold(bench, threshold):
    probes = []

    def fits(k):
        probes.append(k)
        return k <= threshold

    assert bench.largest_fitting(fits, 3, 64) == threshold
    assert len(probes) <= math.ceil(math.log2(64 - 3 + 1)) + 1


def test_largest_fitting_when_nothing_fits(bench):
    assert bench.largest_fitting(lambda k: False, 1, 100) is None


def test_dit_input_builder(bench):
    builder = bench.input_builder_for("DiT-T/2")
    assert builder.unit == "resolution" and builder.granularity("DiT-T/2") == 16
    trial = builder.build("DiT-T/2", 64)  # 8x8 latent, 2x2 patches -> 16 tokens
    assert trial.tokens == 16
    x, t, y = trial.inputs
    assert x.shape == (1, 4, 8, 8)
    assert trial.model(x, t, y).shape[-2:] == (8, 8)
    assert trial.flops == 3 * bench.dit_forward_flops(trial.model)  # training = forward + 2x backward


def test_unknown_family_and_duplicate_builder(bench):
    with pytest.raises(KeyError, match="no input builder.*register_input_builder"):
        bench.input_builder_for("Unknown-XL/2")
    with pytest.raises(ValueError, match="already registered"):
        bench.register_input_builder("DiT", "resolution", lambda n: 16, (256, 512))(lambda n, s: None)


def test_run_searches_each_mode_and_times_it_at_every_maximum(bench, monkeypatch):
    limits = {"none": 512, "full": 1024, "offload": 1536}  # largest resolution each mode fits
    timed = []

    def fake_measure(builder, name, size, mode, device, timed_steps):
        if timed_steps:
            timed.append((mode, size))
        if size > limits[mode]:
            return None
        return bench.Measurement(tokens=(size // 16) ** 2, step_ms=size / 10, peak_bytes=2 ** 30, flops=1e12)

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake H100")
    rows = bench.run("DiT-T/2", list(limits), (256, 2048), timed_steps=2, device=torch.device("cpu"))
    assert {r["mode"]: r["size"] for r in rows if r["is_max"]} == limits
    # each mode timed at every mode's maximum it fits: offload's overhead is read where full checkpointing stops
    assert timed == [("none", 512), ("full", 512), ("full", 1024), ("offload", 512), ("offload", 1024),
                     ("offload", 1536)]
    assert {(r["mode"], r["size"]) for r in rows} == set(timed)
    assert rows[0]["tokens"] == 32 ** 2 and rows[0]["mfu"] == round(1e12 / 51.2e-3 / 1e12 / 989.0, 4)


def test_summary_and_results_files(bench, tmp_path):
    def row(mode, size, tokens, is_max, ms):
        return dict(model="DiT-T/2", mode=mode, unit="resolution", size=size, tokens=tokens, is_max=is_max,
                    step_ms=ms, tflops=1.0, mfu="", peak_gib=1.0, device="Fake GPU", torch=torch.__version__)

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
