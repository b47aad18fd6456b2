"""A multi-node dry run on one machine: two torchrun agents ("nodes") of 2 gloo ranks each meet at a
c10d rendezvous on localhost and train the demo model; the run equals one process on the whole
global batch. Each sample's noise, time and label dropout are drawn from its own stream (seeded by
the dataset index and step), so the rank layout changes only the order of floating-point sums.
Also checks the Slurm launcher's command line."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.distributed import free_port
from tests.script_server import run_script
from tests.scripts.test_train_sample import ROOT, model_weights

# The demo's model and data (DiT-Mini/2, 16x16 shapes), a few steps of a small global batch.
TINY = ["--config", "configs/demo.yaml", "data.num_samples=64",
        "global_batch_size=8", "max_steps=3", "log_every=3", "logger=[]", "ema.enable=false"]


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", *args]


def run_all(commands, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in commands]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    return outputs


@pytest.mark.slow
def test_two_nodes_of_two_ranks_equal_one_process(tmp_path):
    two, one = str(tmp_path / "two_nodes"), str(tmp_path / "one_process")
    endpoint = f"127.0.0.1:{free_port()}"
    node = torchrun("--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                    "--rdzv_id", "dry_run", "train.py", *TINY, f"results_dir={two}", "exp_name=mn")
    run_all([node, node])  # the two "nodes"
    one_process = ["train.py", *TINY, f"results_dir={one}", "exp_name=mn"]
    proc = run_script(one_process, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = [[json.loads(line) for line in open(os.path.join(d, "mn", "metrics.jsonl"))] for d in (two, one)]
    assert records[0][-1]["step"] == records[1][-1]["step"] == 3
    # 4 ranks average their 2-sample means, one process its 8-sample mean: equal up to rounding
    assert records[0][-1]["loss"] == pytest.approx(records[1][-1]["loss"], rel=1e-5)
    wa, wb = (model_weights(os.path.join(d, "mn", "checkpoints", "mn_step3")) for d in (two, one))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-6, msg=k)


def test_slurm_launcher_command():
    env = {**os.environ, "DRY_RUN": "1", "SLURM_NNODES": "2", "SLURM_JOB_ID": "42", "HEAD_NODE": "gpu-a01"}
    out = subprocess.run(["bash", "scripts/launch_slurm.sh", "configs/dit_xl2_256.yaml", "zero_degree=2",
                          "group_zero=true"], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "torchrun", "--nnodes", "2",
                           "--nproc_per_node", "8", "--rdzv_id", "42", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                           "gpu-a01:29500", "train.py", "--config", "configs/dit_xl2_256.yaml", "zero_degree=2",
                           "group_zero=true"]
