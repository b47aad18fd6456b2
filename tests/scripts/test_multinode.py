"""A multi-node dry run on one machine: two torchrun agents ("nodes") of 2 gloo ranks each meet at a
c10d rendezvous on localhost and train the demo model; the run equals one node of 4 ranks (same
global batch, same ranks, so bit-identical loss and weights). One process is not the reference:
each data-parallel rank draws its own noise and timesteps, so a different rank count is a
different (equally valid) random stream. Also checks the Slurm launcher's command line."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.distributed import free_port
from tests.scripts.test_train_sample import ROOT, model_weights

TINY = ["--config", "configs/demo.yaml", "model.name=DiT-T/2", "data.image_size=16", "data.num_samples=64",
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
def test_two_nodes_of_two_ranks_equal_one_node_of_four(tmp_path):
    two, one = str(tmp_path / "two_nodes"), str(tmp_path / "one_node")
    endpoint = f"127.0.0.1:{free_port()}"
    node = torchrun("--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                    "--rdzv_id", "dry_run", "train.py", *TINY, f"results_dir={two}", "exp_name=mn")
    run_all([node, node])  # the two "nodes"
    run_all([torchrun("--standalone", "--nproc_per_node", "4", "train.py", *TINY, f"results_dir={one}",
                      "exp_name=mn")])
    losses = [json.loads(open(os.path.join(d, "mn", "metrics.jsonl")).read().splitlines()[-1])["loss"]
              for d in (two, one)]
    assert losses[0] == losses[1]
    wa, wb = (model_weights(os.path.join(d, "mn", "checkpoints", "mn_step3")) for d in (two, one))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)


def test_slurm_launcher_command():
    env = {**os.environ, "DRY_RUN": "1", "SLURM_NNODES": "2", "SLURM_JOB_ID": "42", "HEAD_NODE": "gpu-a01"}
    out = subprocess.run(["bash", "scripts/launch_slurm.sh", "configs/dit_xl2_256.yaml", "zero_degree=2",
                          "group_zero=true"], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "torchrun", "--nnodes", "2",
                           "--nproc_per_node", "8", "--rdzv_id", "42", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                           "gpu-a01:29500", "train.py", "--config", "configs/dit_xl2_256.yaml", "zero_degree=2",
                           "group_zero=true"]
