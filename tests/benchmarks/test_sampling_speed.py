"""benchmarks/sampling_speed.py: its dry size runs every row of the three demos (1 process, sp 2 and
CFG-parallel ranks on 2 gloo processes, each step cache) with random tiny checkpoints, and
docs/sampling.md's table is the one of the committed results file."""

import json
import math
import os

import pytest

from tests.benchmarks.scripts import BENCH_DIR, ROOT, import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("sampling_speed")


def test_dry_run_measures_every_setting_of_every_demo(bench, tmp_path):
    results = bench.main(["--dry", "--out-dir", str(tmp_path)])
    rows = {(r["demo"], r["setting"]): r for r in results["rows"]}
    assert set(rows) == {(demo, name) for demo in bench.DEMOS for name, _, _, _ in bench.SETTINGS}
    for (demo, name), r in rows.items():
        assert r["weights"] == "random" and r["seconds"] > 0 and 0 < r["computed"] <= 1, (demo, name, r)
        if name in ("sp 2", "cfg-parallel 2", "1 process, 2 threads"):  # the one-process samples, to fp32 rounding
            assert r["psnr_db"] > 60 and r["computed"] == 1, (demo, name, r)
        if name.startswith("cache"):  # a cache that reused something changed the samples
            assert r["model_calls"] == 3, (demo, name, r)
            assert math.isfinite(r["psnr_db"]) or r["computed"] == 1, (demo, name, r)
    with open(tmp_path / "sampling_speed.json") as f:
        assert json.load(f)["rows"] == json.loads(json.dumps(results["rows"]))
    assert (tmp_path / "sampling_speed.md").read_text().count("\n| ") == len(rows) + 1


def test_docs_table_is_the_committed_results(bench):
    with open(os.path.join(BENCH_DIR, "results", "sampling_speed.json")) as f:
        results = json.load(f)
    assert not results["dry"]
    with open(os.path.join(ROOT, "docs", "sampling.md")) as f:
        doc = f.read()
    missing = [line for line in bench.doc_table(results) if line not in doc]
    assert not missing, "docs/sampling.md differs from benchmarks/results/sampling_speed.json: " + "; ".join(missing)


def test_readme_table_is_the_committed_results(bench):
    with open(os.path.join(BENCH_DIR, "results", "sampling_speed.json")) as f:
        results = json.load(f)
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    table = "\n".join(bench.readme_table(results))
    assert table in readme, "README.md's sampling table differs from benchmarks/results/sampling_speed.json"
