"""Golden loss curves: the demo configs trained a few steps on CPU in fp32 must give exactly the
losses recorded in tests/golden/*.json. The curves were first written by the trainers before they
shared one loop and parallelize(), and reproduced exactly by them. They were re-recorded when the
training draws became per sample (noise, time and label dropout keyed by dataset index and step),
which changes every random number, and demo.json again when the demo became DiT-Mini/2 on 16x16
pixels (a different model). Any other change to a loss must be deliberate:
re-record with ``python tests/pipeline/test_golden_loss.py --record`` and say why in the commit.
The image run is repeated with activation checkpointing, which must not change a loss either. All
runs share one process: one start-up, trainers called through their ``main``."""

import glob
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.script_server import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = sorted(glob.glob(os.path.join(ROOT, "tests", "golden", "*.json")))
VARIANTS = {"": [], "+ac": ["selective_ratio=0.5"]}  # extra overrides, checked against the same curve

RUN_ALL = r"""
import json, sys
import train, train_video
mains = {"train.py": train.main, "train_video.py": train_video.main}
for script, args in json.loads(sys.argv[1]):
    mains[script](args)
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("golden"))
    jobs, expected = [], {}
    for path in GOLDEN:
        golden = json.load(open(path))
        name = os.path.splitext(os.path.basename(path))[0]
        variants = VARIANTS if golden["script"] == "train.py" else {"": []}
        for suffix, extra in variants.items():
            exp = f"{name}{suffix}"
            jobs.append((golden["script"], ["--config", golden["config"], *golden["overrides"], *extra,
                                            f"results_dir={out}", f"exp_name={exp}"]))
            expected[exp] = golden["losses"]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = run_script(["-c", RUN_ALL, json.dumps(jobs)], cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, expected


def test_golden_files_cover_both_demo_configs():
    names = {os.path.basename(p) for p in GOLDEN}
    assert {"demo.json", "video_stdit_demo.json"} <= names


def test_trainers_reproduce_the_golden_losses(runs):
    out, expected = runs
    for exp, losses in expected.items():
        got = [json.loads(line)["loss"] for line in open(os.path.join(out, exp, "metrics.jsonl"))]
        assert len(got) == len(losses), exp
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(losses, dtype=torch.float64),
                                   rtol=0, atol=1e-6, msg=lambda m: f"{exp}: {m}")


def record(out: str) -> None:
    """Rewrite the ``losses`` of every golden file from fresh runs of its script and overrides."""
    jobs = []
    for path in GOLDEN:
        golden = json.load(open(path))
        exp = os.path.splitext(os.path.basename(path))[0]
        jobs.append((golden["script"], ["--config", golden["config"], *golden["overrides"], f"results_dir={out}",
                                        f"exp_name={exp}"]))
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", RUN_ALL, json.dumps(jobs)], cwd=ROOT, check=True, env=env)
    for path in GOLDEN:
        golden = json.load(open(path))
        exp = os.path.splitext(os.path.basename(path))[0]
        golden["losses"] = [json.loads(line)["loss"] for line in open(os.path.join(out, exp, "metrics.jsonl"))]
        with open(path, "w") as f:
            json.dump(golden, f, indent=1)
            f.write("\n")
        print(f"recorded {path}: {golden['losses']}")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/pipeline/test_golden_loss.py --record")
    with tempfile.TemporaryDirectory() as tmp:
        record(tmp)
