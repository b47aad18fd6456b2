"""``python -m opendit_lite.launch``: torchrun's options and command, ending as the scripts do: a
SIGTERM or Ctrl-C to the launcher ends with one line and exit code 130 (torchrun: a traceback and
1), failed ranks with their summary and their own exit code (torchrun: 1)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from opendit_lite import launch
from opendit_lite.checkpoint.catalog import list_checkpoints
from tests.reliability.test_run_folder import EXP, ROOT, TIMEOUT, train_args


def _run_raising(monkeypatch, error):
    def run(args):
        assert args.nproc_per_node == "2" and args.training_script == "train.py"
        if error is not None:
            raise error

    monkeypatch.setattr("torch.distributed.run.run", run)
    return launch.main(["--standalone", "--nproc_per_node", "2", "train.py", "--config", "configs/demo.yaml"])


def _failed(*codes):
    return ChildFailedError("train.py", {rank: ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code,
                                                              error_file="/nonexistent/error.json")
                                         for rank, code in enumerate(codes)})


def test_how_the_launcher_ends(monkeypatch, capsys):
    assert _run_raising(monkeypatch, None) == 0
    assert _run_raising(monkeypatch, SignalException("got signal", signal.SIGTERM)) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["stopped: the launcher got SIGTERM and passed it on to every rank (rank 0's line above says "
                     "where the run stopped)."]
    for codes, expected in (((2, 2), 2), ((130, 130), 130), ((3,), 3), ((2, 130), 1), ((1, 1), 1), ((-9, 2), 1)):
        assert _run_raising(monkeypatch, _failed(*codes)) == expected, codes
        err = capsys.readouterr().err
        assert "train.py FAILED" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_sigterm_to_the_launcher_of_two_ranks_ends_with_one_line_and_130(tmp_path):
    """Each rank saves at the step the ranks agree on; the launcher ends with one line and 130."""
    proc = subprocess.Popen([sys.executable, "-m", "opendit_lite.launch", "--standalone", "--nproc_per_node", "2",
                             "train.py", *train_args(tmp_path, "max_steps=100000", "log_every=1000")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    ready, deadline = tmp_path / EXP / "config.yaml", time.time() + TIMEOUT
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # training has started
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err and "SignalException" not in out + err, out + err
    assert err.strip().splitlines()[-1].startswith("stopped: the launcher got SIGTERM"), err
    assert "stopped: a stop signal was honoured at step" in err, err
    assert len(list_checkpoints(str(tmp_path / EXP / "checkpoints"), EXP)) == 1
