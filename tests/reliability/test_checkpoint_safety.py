"""Checkpoints are never lost: run-scoped pruning that keeps the last finite one, the ``*.old-*``
copy of a re-saved step, and SIGKILL at random moments of saving always leaving the newest
complete checkpoint to auto_resume, and only litter that the next start-up removes."""

import json
import multiprocessing
import os
import random
import signal
import time

from opendit_lite.checkpoint.catalog import list_checkpoints, verify_checkpoint
from opendit_lite.checkpoint.layout import newest_verified_checkpoint
from opendit_lite.checkpoint.litter import remove_orphaned_tmp
from opendit_lite.checkpoint.save_restore import _prune
from opendit_lite.plugins import OpenDiTPlugin  # noqa: F401  imported once here, before the children fork
from tests.checkpoint.test_state import _save, _setup, _train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXP = "run"


def fake_checkpoint(root, step, run_id="r1", finite=True, name=None):
    path = os.path.join(root, name or f"{EXP}_step{step}")
    os.makedirs(path)
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump({"version": 1, "step": step, "files": {}, "run_id": run_id, "finite": finite}, f)
    return path


def steps(root):
    return [s for s, _ in list_checkpoints(root, EXP)]


def test_prune_touches_only_older_checkpoints_of_this_run(tmp_path):
    root = str(tmp_path)
    for step in (1, 2):
        fake_checkpoint(root, step, run_id="other")
    for step in (3, 4, 5):
        fake_checkpoint(root, step)
    newest = fake_checkpoint(root, 6)
    _prune(root, EXP, 2, newest, "r1")
    assert steps(root) == [1, 2, 5, 6]


def test_prune_keeps_everything_when_the_newest_is_not_finite(tmp_path):
    root = str(tmp_path)
    fake_checkpoint(root, 1)
    newest = fake_checkpoint(root, 2, finite=False)
    _prune(root, EXP, 1, newest, "r1")
    assert steps(root) == [1, 2]


def test_a_resave_killed_between_its_renames_leaves_the_old_copy(tmp_path):
    """atomic_path moves the complete step-4 folder aside before moving the new one in; a kill
    between the two renames leaves only ``run_step4.old-<uid>`` (and the new ``.tmp-``)."""
    root = str(tmp_path)
    fake_checkpoint(root, 3)
    old = fake_checkpoint(root, 4, name=f"{EXP}_step4.old-0123456789ab")
    os.makedirs(os.path.join(root, f"{EXP}_step4.tmp-0123456789ab"))
    assert list_checkpoints(root, EXP) == [(3, os.path.join(root, f"{EXP}_step3")), (4, old)]
    assert newest_verified_checkpoint(root, EXP, report=lambda _: None) == old
    final = fake_checkpoint(root, 4)  # once the final name exists it wins over the old copy
    assert list_checkpoints(root, EXP)[-1] == (4, final)


def _child_saves_forever(root):
    """Runs in a child process: train and save steps 1, 2, 2, 3, 3, ... (each step saved twice, so
    that re-saves happen too) with keep_last=2, until killed."""
    import socket

    import torch.distributed as dist

    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parts = _setup(0)
    step = 0
    while True:
        _train(parts, step, 1)
        step += 1
        for _ in range(2):
            _save(parts, root, step, EXP, keep_last=2, run_id="kill")


def test_sigkill_at_random_moments_of_saving_then_auto_resume(tmp_path):
    """Several trials, each a child killed at a random moment. The children fork from one
    forkserver that imported everything once (fast, and free of this process's threads)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.reliability.test_checkpoint_safety"])
    rng = random.Random(0)
    for trial in range(4):
        root = str(tmp_path / f"trial{trial}")
        os.makedirs(root)
        child = ctx.Process(target=_child_saves_forever, args=(root,), daemon=True)
        child.start()
        try:
            deadline = time.time() + 180
            while len(steps(root)) < 1:
                assert child.is_alive(), f"the saving process exited early ({child.exitcode})"
                assert time.time() < deadline, "no checkpoint was ever completed"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 1.5))  # somewhere inside the following saves, renames and prunes
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.join(30)
        found = list_checkpoints(root, EXP)
        assert found, os.listdir(root)
        chosen = newest_verified_checkpoint(root, EXP, report=lambda _: None)
        assert chosen == found[-1][1], (trial, chosen, os.listdir(root))  # the newest complete one verifies
        assert verify_checkpoint(chosen)["step"] == found[-1][0]
        # The next run's start-up clean-up: whatever the killed saver left under a temporary name goes,
        # the complete checkpoints stay.
        litter = sorted(n for n in os.listdir(root) if ".tmp-" in n)
        assert sorted(os.path.basename(p) for p in remove_orphaned_tmp(root, EXP)) == litter
        assert list_checkpoints(root, EXP) == found and not [n for n in os.listdir(root) if ".tmp-" in n]
