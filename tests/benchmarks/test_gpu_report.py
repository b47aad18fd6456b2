"""benchmarks/gpu_report.py, the one prepared GPU command, checked on the CPU: its dry run (every
section at toy sizes, then the files' schema), the time each section gets, a section cut by its
timeout or crashing keeps the rows written before, the pytest log parser, the README's generated
block, and `make gpu-report` refusing at once without CUDA."""

import importlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from tests.benchmarks.scripts import BENCH_DIR, ROOT, import_benchmark
from tests.script_server import run_script

SCRIPT = os.path.join(BENCH_DIR, "gpu_report.py")


@pytest.fixture(scope="module")
def report():
    return import_benchmark("gpu_report")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run for the module: (completed process, output folder)."""
    out = tmp_path_factory.mktemp("gpu_report")
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "OUT"):
        env.pop(key, None)  # a world of one, whatever launched pytest
    start = time.monotonic()
    proc = run_script([SCRIPT, "--dry-run", "--out", str(out)], cwd=ROOT, env=env, timeout=300)
    proc.seconds = time.monotonic() - start
    return proc, out


def test_dry_run_runs_every_section_and_writes_valid_files(report, dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((out / "results.json").read_text())
    assert report.check_schema(doc, str(out)) == []
    assert doc["run"]["dry_run"] and doc["run"]["finished"]
    assert [s["name"] for s in doc["sections"]] == [s.name for s in report.SECTIONS]
    assert {s["name"]: s["status"] for s in doc["sections"]} == {s.name: "ok" for s in report.SECTIONS}
    rows = {s["name"]: s["rows"] for s in doc["sections"]}
    for section in rows.values():
        for row in section:
            assert row["device"].startswith("CPU") and row["torch"] == torch.__version__ and row["triton"]

    tests = rows["tests"][0]
    assert tests["passed"] > 0 and tests["failed"] == 0 and tests["skipped"] >= 1 and tests["finished"]
    assert "PASSED" in (out / "pytest.log").read_text()
    phases = [(r["config"], r["phase"]) for r in rows["train_bf16"]]
    assert phases[0] == ("torch-bf16-compile", "batch 2") and phases[1] == ("zero0+kernels+compile", "batch 2")
    assert phases[2][1].startswith("largest batch") and all(r["status"] == "ok" for r in rows["train_bf16"])
    assert rows["train_bf16"][0]["vs_baseline"] is None and rows["train_bf16"][1]["vs_baseline"] > 0
    loss = rows["train_fp8"][-1]
    assert loss["kind"] == "loss" and not loss["fp8"] and loss["loss_bf16"] > 0
    fp8_notes = next(s["notes"] for s in doc["sections"] if s["name"] == "train_fp8")
    assert any("refused here" in n and "exit 2" in n for n in fp8_notes)
    kernels = [r for r in rows["kernels"] if r["kind"] == "kernel"]
    assert {r["kernel"] for r in kernels} == {"fused_adaln", "gated_residual", "layernorm"}
    assert {r["provider"] for r in kernels} == {"eager", "compile", "triton"}
    assert {r["mode"] for r in kernels} == {"forward", "backward", "full"}
    assert all(r["speedup_vs_eager"] > 0 and r["speedup_vs_compile"] > 0 for r in kernels)
    choices = [r for r in rows["kernels"] if r["kind"] == "choice"]  # what the dispatch serves: the faster
    assert {r["kernel"] for r in choices} == {"fused_adaln", "gated_residual", "layernorm"}
    for r in choices:
        assert r["ours_ms"] == min(r["triton_ms"], r["compile_ms"]) and r["ours_vs_compile"] >= 1
        assert r["provider"] == ("compile" if r["compile_ms"] < r["triton_ms"] else "triton")
    assert rows["plan"][0]["kind"] == "activations" and rows["plan"][0]["act_ratio"] > 0
    maxima = {r["mode"]: r["batch"] for r in rows["max_seq_len"] if r["kind"] == "max"}
    assert maxima == {"none": 3, "full": 6, "offload": 9}
    wan = rows["wan_train"]
    assert [(r["mode"], r["impl"]) for r in wan] == [("full", "diffusers"), ("full", "ours"), ("lora", "diffusers"),
                                                      ("lora", "ours")]
    assert all(r["step_ms"] > 0 and r["tflops"] >= 0 and not r["checkpointed"] for r in wan)
    assert wan[0]["vs_diffusers"] is None and wan[1]["vs_diffusers"] == pytest.approx(
        wan[0]["step_ms"] / wan[1]["step_ms"], rel=1e-2)
    assert "peft LoRA" in wan[2]["settings"] and "lora: peft LoRA rank 32" in wan[3]["settings"]
    capped, uncapped = rows["wan_24gb"]
    assert capped["status"] == uncapped["status"] == "ok" and capped["case"] == "capped at 24 GiB"
    assert capped["cap_gib"] is None and uncapped["cap_gib"] is None  # no cap on the CPU: CUDA's allocator's
    # the toy device is so small that the planner swaps blocks, quantizes the base and checkpoints, as at 24 GiB
    assert capped["blocks_to_swap"] > 0 and capped["base_precision"] != "none" and capped["selective_ratio"] == 0
    assert "block_swap: 3 of 4 blocks" in capped["settings"] and uncapped["blocks_to_swap"] == 0
    assert uncapped["capped_over_uncapped_time"] > 0
    assert any("the planner's fragment" in n and "blocks_to_swap: 3" in n
               for n in next(s["notes"] for s in doc["sections"] if s["name"] == "wan_24gb"))

    summary = (out / "summary.md").read_text()
    assert summary.startswith("# GPU report (dry run") and "| `kernels` | ok |" in summary
    print(f"dry run: {proc.seconds:.0f} s")


def test_readme_table_from_a_gpu_results_file(report, dry_run):
    """The README block rendered from a (non-dry) results document holds the headline tables."""
    _, out = dry_run
    doc = json.loads((out / "results.json").read_text())
    assert report.readme_table(doc).startswith("No GPU results are committed yet")  # a dry run is not a result
    doc["run"]["dry_run"] = False
    text = report.readme_table(doc)
    assert "| config | precision | batch_per_gpu | samples_per_s | vs_baseline | mfu | peak_alloc_gib |" in text
    assert "| zero0+kernels+compile | bf16 | 2 |" in text
    assert "| kernel | shape | gbps | frac_of_copy_bw | speedup_vs_eager | speedup_vs_compile |" in text
    assert "GPU and kernel tests:" in text and "fp8 against bf16 after 6 steps" in text
    assert "| kernel | shape | provider | triton_ms | compile_ms | ours_vs_compile |" in text
    wan = report.wan_readme_table(doc)
    assert "| 5x32x32 | 8 | full | diffusers |" in wan and "| capped at 24 GiB | 3 | nf4 | 0 |" in wan
    doc["run"]["dry_run"] = True
    assert report.wan_readme_table(doc).startswith("No Wan results are committed yet")


def test_second_part_has_its_own_files(report, monkeypatch, tmp_path):
    """The wan part writes results_wan.json and summary_wan.md, so that both parts' files sit in one folder."""
    monkeypatch.setattr(report, "BY_NAME", {"wan_train": report.Section("wan_train", "t", 1.0,
                                                                        lambda ctx: ctx.note("ran"))})
    doc = report.run_report(str(tmp_path), 5.0, ["wan_train"], True, "fork", report.Options(part="wan"))
    assert doc["run"]["part"] == "wan" and doc["sections"][0]["notes"] == ["ran"]
    assert sorted(os.listdir(tmp_path)) == ["results_wan.json", "summary_wan.md"]
    assert report.check_schema(doc, str(tmp_path)) == []


def test_readme_block_is_generated_from_the_committed_results(report):
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert report.readme_block(report.committed_results(), report.committed_results("wan")) in readme, (
        "README.md's gpu-report block differs from benchmarks/results/results.json: run "
        "python benchmarks/gpu_report.py --readme-table --write")


def test_allot_reserves_the_later_caps_and_passes_savings_on(report):
    for part, names in report.PARTS.items():  # each part: caps within its budget, the last uncapped
        caps = [report.BY_NAME[n].cap_s for n in names]
        assert caps[-1] is None and None not in caps[:-1] and sum(caps[:-1]) <= report.PART_BUDGET_S, part
    assert [s.name for s in report.SECTIONS] == [n for names in report.PARTS.values() for n in names]
    sections = [report.BY_NAME[n] for n in report.PARTS["dit"]]
    assert sum(s.cap_s for s in sections if s.cap_s is not None) == 480.0  # the default budget
    # both parts in one run: the first part's uncapped section leaves the second part's caps
    wan = [report.BY_NAME[n] for n in report.PARTS["wan"]]
    assert report.allot(sections[-1], wan, 500.0) == 500.0 - wan[0].cap_s
    assert report.allot(sections[-1], wan, 100.0) == pytest.approx(100.0 / 3)
    # the default budget: each capped section gets its cap when the earlier ones used theirs
    assert report.allot(sections[0], sections[1:], 480.0) == sections[0].cap_s
    assert report.allot(sections[1], sections[2:], 480.0 - sections[0].cap_s) == sections[1].cap_s
    # 50 s the first section left unused go to the second
    assert report.allot(sections[1], sections[2:], 480.0 - 65.0, banked=50.0) == sections[1].cap_s + 50.0
    # the last capped section does not take the time of the uncapped one after it
    assert report.allot(sections[-2], sections[-1:], 300.0) == sections[-2].cap_s
    assert report.allot(sections[-1], [], 33.0) == 33.0
    # a budget smaller than the caps: proportional shares
    share = report.allot(sections[0], sections[1:], 240.0)
    assert share == pytest.approx(240.0 * sections[0].cap_s / 480.0)


def _record_then_hang(ctx):
    ctx.record(dict(kind="step", model="M", latent="1x1x1", batch=1, predicted_gib=1.0, measured_peak_gib=1.0,
                    ratio=1.0))
    time.sleep(60)


def _record_then_crash(ctx):
    ctx.record(dict(kind="max", mode="none", size=256, batch=3, tokens=768, max_is_lower_bound=False))
    raise RuntimeError("device lost")


def _skip(ctx):
    raise sys.modules["gpu_report"].SectionSkipped("no FP8 tensor cores")


def test_cut_and_crashed_sections_keep_their_rows(report, monkeypatch, tmp_path):
    """A section stopped at its timeout and one that crashes keep the rows they wrote; the next
    section still runs; the statuses and notes say what happened."""
    fake = {name: report.Section(name, name, cap, run) for name, cap, run in [
        ("plan", 2.0, _record_then_hang), ("max_seq_len", None, _record_then_crash), ("train_fp8", 1.0, _skip)]}
    monkeypatch.setattr(report, "BY_NAME", fake)
    monkeypatch.setattr(report, "MIN_SECTION_S", 0.5)
    start = time.monotonic()
    doc = report.run_report(str(tmp_path), 6.0, ["train_fp8", "plan", "max_seq_len"], dry_run=True,
                            start_method="fork")
    assert time.monotonic() - start < 30
    sections = {s["name"]: s for s in doc["sections"]}
    assert sections["plan"]["status"] == "timeout" and len(sections["plan"]["rows"]) == 1
    assert any("stopped at its timeout" in n for n in sections["plan"]["notes"])
    assert sections["max_seq_len"]["status"] == "failed" and sections["max_seq_len"]["rows"][0]["batch"] == 3
    assert any("RuntimeError: device lost" in n for n in sections["max_seq_len"]["notes"])
    assert sections["train_fp8"]["status"] == "skipped"
    assert sections["train_fp8"]["notes"] == ["skipped: no FP8 tensor cores"]
    assert report.check_schema(doc) == []
    summary = (tmp_path / "summary.md").read_text()
    assert "| `plan` | timeout |" in summary and "| `max_seq_len` | failed |" in summary


def test_schema_check_names_what_is_wrong(report):
    stamp = dict(device="GPU", torch="2.11", triton="3.6")
    doc = dict(schema=report.SCHEMA_VERSION,
               run=dict(stamp, python="3.12", commit="abc", date="today", budget_s=480, dry_run=False, finished=True),
               sections=[dict(name="tests", status="ok", timeout_s=1, seconds=1, notes=[],
                              rows=[dict(kind="tests", passed=1, failed=0, errors=0, skipped=0, failing=[],
                                         finished=True, **stamp)])])
    assert report.check_schema(doc) == []
    doc["sections"][0]["rows"][0].pop("triton")
    doc["sections"][0]["rows"].append(dict(kind="mystery", **stamp))
    doc["sections"][0]["status"] = "great"
    problems = report.check_schema(doc)
    assert any("status 'great'" in p for p in problems)
    assert any("row 0 (tests): no triton" in p for p in problems)
    assert any("unknown kind 'mystery'" in p for p in problems)


def test_pytest_log_parser(report):
    xdist = "\n".join([
        "[gw0] [ 10%] PASSED tests/kernels/test_a.py::test_x[1-2]",
        "[gw1] [ 20%] FAILED tests/kernels/test_a.py::test_y",
        "[gw0] [ 30%] SKIPPED tests/plugins/test_p.py::test_gpu",
        "_____________ ERROR collecting tests/foo/test_bar.py _____________",
        "ERROR tests/foo/test_bar.py - ModuleNotFoundError: No module named 'av'",
        "==== 1 failed, 1 passed, 1 skipped, 1 error in 12.34s ====",
    ])
    r = report.parse_pytest_log(xdist)
    assert (r["passed"], r["failed"], r["skipped"], r["errors"], r["finished"]) == (1, 1, 1, 1, True)
    assert r["failing"] == ["tests/kernels/test_a.py::test_y"]
    assert r["collection_errors"] == ["tests/foo/test_bar.py"]
    plain = "tests/kernels/test_a.py::test_x PASSED [ 50%]\ntests/kernels/test_a.py::test_z ERROR [100%]\n"
    r = report.parse_pytest_log(plain)  # cut before pytest's closing line
    assert (r["passed"], r["errors"], r["finished"]) == (1, 1, False)


def test_without_cuda_the_report_refuses_at_once(report, capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the refusal without a GPU")
    assert report.main(["--budget", "10"]) == 2
    err = capsys.readouterr().err
    assert "none is visible" in err and "--dry-run" in err


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_make_gpu_report_stops_before_installing_anything(tmp_path):
    site = tmp_path / "site"
    out = subprocess.run(["make", "-s", "gpu-report", f"PYTHON={sys.executable}", f"GPU_SITE={site}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no CUDA GPU is visible" in out.stderr and "--dry-run" in out.stderr
    assert not site.exists()


def test_bundle_script_parses_and_reads_the_pins():
    assert subprocess.run(["bash", "-n", os.path.join(ROOT, "scripts", "gpu_bundle.sh")]).returncode == 0
    text = open(os.path.join(ROOT, "scripts", "gpu_bundle.sh")).read()
    for name in ("diffusers", "pydantic", "galore-torch", "bitsandbytes", "colossalai", "contexttimer"):
        assert f"$(pin {name})" in text
    assert "BUILD_EXT=0" in text and "limit_mib=60" in text


def test_gpu_test_files_cover_the_marked_tests(report):
    files = report.gpu_test_files()
    assert "tests/plugins/test_plugin_gpu.py" in files and "tests/activation_checkpointing/test_gpu.py" in files
    kernels = sorted(f for f in os.listdir(os.path.join(ROOT, "tests", "kernels")) if f.startswith("test_"))
    assert [f for f in files if f.startswith("tests/kernels/")] == [f"tests/kernels/{f}" for f in kernels]
    assert "tests/benchmarks/test_gpu_report.py" not in files


def test_options_of_a_shorter_run(report):
    args = report.parse_args(["--only", "kernels", "train_bf16", "tests", "--tests", "tests/a.py::t[x]",
                              "--kernel-shapes", "128x256x1152", "1X65536x1152", "--no-batch-search",
                              "--train-steps", "2", "5"])
    options = report.options_from(args)
    assert options == report.Options(tests=("tests/a.py::t[x]",), kernel_shapes=((128, 256, 1152), (1, 65536, 1152)),
                                     batch_search=False, train_steps=(2, 5))
    assert report.options_from(report.parse_args([])) == report.Options()  # the first part on the GPU
    assert report.parse_args(["--dry-run"]).part == "all" and report.parse_args(["--part", "wan"]).part == "wan"
    with pytest.raises(SystemExit):  # a section of the other part
        report.parse_args(["--only", "wan_train"])
    for bad in (["--kernel-shapes", "128x256"], ["--train-steps", "0", "5"]):
        with pytest.raises(SystemExit):
            report.parse_args(bad)


def test_commit_named_by_the_environment_wins(report, monkeypatch):
    """A copy of the tree may carry a stale .git: GPU_REPORT_COMMIT, set by whoever copied it, names the commit."""
    common = importlib.import_module("common")
    monkeypatch.setenv("GPU_REPORT_COMMIT", "53ff083")
    assert common.git_commit() == "53ff083"
    monkeypatch.delenv("GPU_REPORT_COMMIT")
    assert common.git_commit() != "53ff083"
