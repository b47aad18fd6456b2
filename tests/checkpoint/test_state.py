"""Distributed checkpoints: world-size changes, exact continuation, atomicity under SIGKILL,
corruption detection and weights-only loading.

Three spawns share one checkpoint folder (module fixture): 2 ranks train, save and resume; 1 rank
loads the 2-rank checkpoint and saves its own; 2 ranks load the 1-rank one. Every resumed run must
end where the uninterrupted 2-rank run ended (fp32, so up to reduction-order rounding).
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from opendit_lite.checkpoint import CheckpointError
from opendit_lite.checkpoint.catalog import find_latest_checkpoint, list_checkpoints, verify_checkpoint
from opendit_lite.checkpoint.files import atomic_path, load_torch_file
from opendit_lite.checkpoint.save_restore import load_checkpoint, save_checkpoint
from opendit_lite.distributed.rng import get_rng_state, set_rng_state
from tests.distributed import run_distributed
from tests.zero_cpu_shim import install as install_zero_cpu_shim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLOBAL_BATCH = 8
EXP = "run"
STRATEGIES = (0, 2)  # zero_degree: DDP and ZeRO-2 (ZeRO-1 shares ZeRO-2's checkpoint IO)
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def run_on_cpu(fn, world_size, args):
    """``run_distributed`` with the GPUs hidden: gloo ranks that would share one GPU take the CPU
    path on a GPU machine too. Set in this process's environment, because the ranks query CUDA
    while importing (before ``run_distributed``'s ``env`` applies)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in CPU_ONLY.items():
            patch.setenv(key, value)
        return run_distributed(fn, world_size, args)


# --------------------------------------------------------------------------------------------------
# A tiny training set-up shared by every process
# --------------------------------------------------------------------------------------------------

def _setup(zero_degree, init_seed=0):
    """Plugin, booster, boosted model/optimizer/LR scheduler and the plugin's EMA (fp32 throughout,
    so that resumed runs are comparable exactly)."""
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin

    install_zero_cpu_shim()
    plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="fp32")
    torch.manual_seed(init_seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3))
    optimizer = plugin.build_optimizer(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=4)
    booster = Booster(plugin=plugin)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    plugin.create_ema(model)
    return booster, model, optimizer, scheduler, plugin


def _train(parts, first_step, n_steps):
    """Steps first_step+1 .. first_step+n_steps; the global batch of a step depends only on the step,
    each rank takes its contiguous slice."""
    booster, model, optimizer, scheduler, plugin = parts
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // world
    for step in range(first_step + 1, first_step + n_steps + 1):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g)
        sl = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = F.mse_loss(model(x[sl]), y[sl])
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        plugin.update_ema(model, decay=0.9)


def _snapshot(parts):
    """Weights, full (gathered) optimizer state, learning rate and full EMA: a collective."""
    _, model, optimizer, scheduler, plugin = parts
    opt_state = optimizer.state_dict()["state"]
    return {
        "params": {k: v.clone() for k, v in model.unwrap().state_dict().items()},
        "exp_avg_sq": [opt_state[i]["exp_avg_sq"].clone() for i in sorted(opt_state)],
        "lr": scheduler.get_last_lr()[0],
        "ema": plugin.ema.state_dict(),
    }


def _assert_close(a, b, atol=1e-5):
    assert abs(a["lr"] - b["lr"]) < 1e-12
    for name in ("params", "ema"):
        assert a[name].keys() == b[name].keys()
        for k in a[name]:
            torch.testing.assert_close(a[name][k], b[name][k], atol=atol, rtol=1e-5, msg=f"{name}.{k}")
    for x, y in zip(a["exp_avg_sq"], b["exp_avg_sq"], strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=1e-4)


def _draws():
    return (torch.rand(3), random.random(), float(np.random.rand()))


def _save(parts, root, step, exp_name, **kw):
    booster, model, optimizer, scheduler, plugin = parts
    return save_checkpoint(booster, root, step, model, optimizer, scheduler, ema=plugin.ema, exp_name=exp_name, **kw)


def _resume(parts, ckpt):
    booster, model, optimizer, scheduler, plugin = parts
    return load_checkpoint(booster, ckpt, model, optimizer, scheduler, ema=plugin.ema)


# --------------------------------------------------------------------------------------------------
# Spawned bodies (each covers every strategy: process start-up dominates the cost)
# --------------------------------------------------------------------------------------------------

def _two_rank_save_and_resume(rank, world, root):
    out = {}
    for zero in STRATEGIES:
        exp = f"{EXP}{zero}"
        parts = _setup(zero)
        _train(parts, 0, 2)
        at_save = _snapshot(parts)
        extra = {"epoch": 0, "sampler_position": 16, "config": {"lr": 1e-2}}
        path = _save(parts, root, 2, exp, extra_state=extra)
        draws_after_save = _draws()
        _assert_close(_snapshot(parts), at_save, atol=0)  # saving leaves the run untouched
        _train(parts, 2, 2)
        final = _snapshot(parts)

        # Same world size: fresh objects with other initial weights, then resume and continue.
        resumed = _setup(zero, init_seed=123)
        assert _resume(resumed, path) == dict(extra, step=2)
        draws_after_load = _draws()
        assert torch.equal(draws_after_load[0], draws_after_save[0])
        assert draws_after_load[1:] == draws_after_save[1:]
        _assert_close(_snapshot(resumed), at_save, atol=0)
        _train(resumed, 2, 2)
        _assert_close(_snapshot(resumed), final, atol=0)
        out[zero] = {"path": path, "at_save": at_save, "final": final}

    # keep_last prunes older complete checkpoints of the same experiment only.
    for step in (1, 2, 3):
        save_checkpoint(parts[0], root, step, parts[1], parts[2], exp_name="prune", keep_last=2)
    out["kept"] = [s for s, _ in list_checkpoints(root, "prune")]
    return out


def _one_rank_cross_load(rank, world, saved, root):
    out = {}
    for zero in STRATEGIES:
        # 2 -> 1: the full global batch on one rank continues the 2-rank run.
        parts = _setup(zero, init_seed=7)
        extra = _resume(parts, saved[zero]["path"])
        assert extra["step"] == 2 and extra["sampler_position"] == 16
        _assert_close(_snapshot(parts), saved[zero]["at_save"])
        _train(parts, 2, 2)
        _assert_close(_snapshot(parts), saved[zero]["final"])

        # The reverse direction starts here: a 1-rank run saved at step 2.
        parts = _setup(zero)
        _train(parts, 0, 2)
        out[zero] = _save(parts, root, 2, f"single{zero}")

    # A malicious pickle in an optimizer file (with a matching manifest, so only the loader can
    # catch it) must be refused without running it.
    evil = os.path.join(root, "evil_step2")
    shutil.copytree(saved[0]["path"], evil)
    marker = os.path.join(root, "pwned")
    torch.save(_Evil(marker), os.path.join(evil, "optimizer", "pytorch_optim_group.bin"))
    _rewrite_manifest_entry(evil, "optimizer/pytorch_optim_group.bin")
    with pytest.raises(CheckpointError, match="optimizer state.*UnpicklingError"):
        _resume(_setup(0), evil)
    assert not os.path.exists(marker)
    return out


def _two_rank_load_one_rank(rank, world, one_rank_ckpts, saved):
    for zero in STRATEGIES:
        parts = _setup(zero, init_seed=99)
        _resume(parts, one_rank_ckpts[zero])
        _train(parts, 2, 2)
        _assert_close(_snapshot(parts), saved[zero]["final"])


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _rewrite_manifest_entry(ckpt, rel):
    meta_path = os.path.join(ckpt, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    path = os.path.join(ckpt, *rel.split("/"))
    with open(path, "rb") as f:
        meta["files"][rel] = {"size": os.path.getsize(path), "crc32": zlib.crc32(f.read())}
    with open(meta_path, "w") as f:
        json.dump(meta, f)


# --------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ckpts"))
    result = run_on_cpu(_two_rank_save_and_resume, 2, (root,))[0]
    return dict(result, root=root)


@pytest.mark.slow
@pytest.mark.parametrize("zero", STRATEGIES)
def test_save_layout_and_same_world_resume(saved, zero):
    path = saved[zero]["path"]
    assert os.path.basename(path) == f"{EXP}{zero}_step2"
    for rel in ("model/model.safetensors.index.json", "optimizer/pytorch_optim.bin.index.json",
                "ema.safetensors", "lr_scheduler.pt", "rng/rank00000.pt", "rng/rank00001.pt", "meta.json"):
        assert os.path.isfile(os.path.join(path, rel)), rel
    meta = verify_checkpoint(path)
    assert (meta["step"], meta["world_size"], meta["dp_size"], meta["sp_size"]) == (2, 2, 2, 1)
    assert meta["zero_degree"] == zero and meta["has_ema"] and meta["has_lr_scheduler"]
    assert not any(tag in name for name in os.listdir(saved["root"]) for tag in (".tmp-", ".old-"))


def test_keep_last(saved):
    assert saved["kept"] == [2, 3]


@pytest.mark.slow
def test_resume_across_world_sizes(saved):
    """2 -> 1 and 1 -> 2 ranks, DDP and ZeRO-2: model, optimizer, EMA and LR scheduler come back and
    the continued runs end where the uninterrupted 2-rank runs ended."""
    one_rank_ckpts = run_on_cpu(_one_rank_cross_load, 1, (saved, saved["root"]))[0]
    run_on_cpu(_two_rank_load_one_rank, 2, (one_rank_ckpts, saved))


@pytest.fixture
def ckpt_copy(saved, tmp_path):
    dst = str(tmp_path / f"{EXP}_step2")
    shutil.copytree(saved[2]["path"], dst)
    return dst


def _shard(ckpt, sub):
    return next(os.path.join(ckpt, sub, n) for n in sorted(os.listdir(os.path.join(ckpt, sub)))
                if not n.endswith(".json"))


def test_truncated_file_is_named(ckpt_copy):
    shard = _shard(ckpt_copy, "model")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    for check_content in (True, False):  # sizes alone catch truncation
        with pytest.raises(CheckpointError, match=f"{shard}.*truncated"):
            verify_checkpoint(ckpt_copy, check_content=check_content)


def test_corrupted_file_is_named(ckpt_copy):
    shard = _shard(ckpt_copy, "optimizer")
    with open(shard, "r+b") as f:  # flip one byte in the middle: same size, different content
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=f"{shard} is corrupted"):
        verify_checkpoint(ckpt_copy)
    verify_checkpoint(ckpt_copy, check_content=False)  # a same-size flip needs the checksum


def test_missing_file_and_bad_meta_are_named(ckpt_copy):
    ema = os.path.join(ckpt_copy, "ema.safetensors")
    os.remove(ema)
    with pytest.raises(CheckpointError, match=f"{ema} is missing"):
        verify_checkpoint(ckpt_copy)
    meta = os.path.join(ckpt_copy, "meta.json")
    with open(meta, "w") as f:
        f.write('{"step": 2, "ver')
    with pytest.raises(CheckpointError, match=f"cannot read {meta}"):
        verify_checkpoint(ckpt_copy)


def test_find_latest_ignores_incomplete(saved, tmp_path):
    root = str(tmp_path)
    for step in (2, 5):
        shutil.copytree(saved[0]["path"], os.path.join(root, f"{EXP}_step{step}"))
    with open(os.path.join(root, f"{EXP}_step5", "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(root, f"{EXP}_step5", "meta.json"), "w") as f:
        json.dump(dict(meta, step=5), f)
    shutil.copytree(saved[0]["path"], os.path.join(root, f"{EXP}_step9.tmp-0123456789ab"))  # killed before rename
    shutil.copytree(saved[0]["path"], os.path.join(root, f"{EXP}_step8"))
    os.remove(os.path.join(root, f"{EXP}_step8", "meta.json"))  # no completion marker
    shutil.copytree(saved[0]["path"], os.path.join(root, f"{EXP}x_step7"))  # another experiment
    assert [s for s, _ in list_checkpoints(root, EXP)] == [2, 5]
    assert find_latest_checkpoint(root, EXP) == os.path.join(root, f"{EXP}_step5")
    assert find_latest_checkpoint(root, "nothing") is None
    assert find_latest_checkpoint(os.path.join(root, "absent"), EXP) is None


def test_atomic_path_publishes_complete_objects_only(tmp_path):
    file, folder = str(tmp_path / "a.pth"), str(tmp_path / "d")
    for content in ("old", "new"):  # a file replaces a file
        with atomic_path(file) as tmp:
            with open(tmp, "w") as f:
                f.write(content)
    with open(file) as f:
        assert f.read() == "new"
    for name in ("old", "new"):  # a folder replaces a folder
        with atomic_path(folder) as tmp:
            os.makedirs(tmp)
            open(os.path.join(tmp, name), "w").close()
    assert os.listdir(folder) == ["new"]
    with atomic_path(file) as tmp:  # a folder replaces a file (e.g. a sharded optimizer)
        os.makedirs(tmp)
    assert os.path.isdir(file)
    with pytest.raises(RuntimeError, match="failed"):
        with atomic_path(str(tmp_path / "z")) as tmp:
            open(tmp, "w").close()
            raise RuntimeError("failed")
    assert sorted(os.listdir(tmp_path)) == ["a.pth", "d"]  # a write that raised takes its temporary object along


def test_torch_files_load_weights_only_even_when_env_forbids(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker, path = str(tmp_path / "pwned"), str(tmp_path / "evil.pt")
    torch.save(_Evil(marker), path)
    with pytest.raises(CheckpointError, match=f"{path} holds pickled Python objects .* so it is refused"):
        load_torch_file(path)
    assert not os.path.exists(marker)
    assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"  # restored afterwards
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ


def test_rng_state_round_trip_weights_only(tmp_path):
    path = str(tmp_path / "rng.pt")
    torch.save(get_rng_state(), path)
    expected = _draws()
    set_rng_state(load_torch_file(path))
    got = _draws()
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_extra_state_must_be_json(tmp_path):
    # Rejected before any file (or collective) is touched, so no booster is needed here.
    with pytest.raises(TypeError, match="extra_state holds a object"):
        save_checkpoint(None, str(tmp_path), 1, None, None, extra_state={"bad": object()})
    with pytest.raises(ValueError, match="contradicts"):
        save_checkpoint(None, str(tmp_path), 1, None, None, extra_state={"step": 3})
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------------
# SIGKILL during a save
# --------------------------------------------------------------------------------------------------

def _child_save_then_block(root):
    """Runs in a subprocess: a complete save at step 1, then a save at step 2 that blocks inside the
    optimizer write (after the model is on disk) until the parent kills the process."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parts = _setup(2)
    _train(parts, 0, 1)
    _save(parts, root, 1, EXP)
    _train(parts, 1, 1)

    def blocking_save_optimizer(*args, **kwargs):
        open(os.path.join(root, "blocked"), "w").close()
        time.sleep(600)

    parts[0].save_optimizer = blocking_save_optimizer
    _save(parts, root, 2, EXP)


def test_sigkill_midway_is_never_picked(tmp_path):
    root = str(tmp_path)
    code = f"import sys; sys.path.insert(0, {ROOT!r}); " \
           f"from tests.checkpoint.test_state import _child_save_then_block as f; f({root!r})"
    env = dict(os.environ, OMP_NUM_THREADS="1", **CPU_ONLY)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 180
        while not os.path.exists(os.path.join(root, "blocked")):
            if proc.poll() is not None:
                pytest.fail(f"the saving process exited early:\n{proc.stderr.read().decode()[-3000:]}")
            if time.time() > deadline:
                pytest.fail("the saving process never reached the optimizer write")
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    names = os.listdir(root)
    assert any(n.startswith(f"{EXP}_step2.tmp-") for n in names), names
    assert f"{EXP}_step2" not in names
    latest = find_latest_checkpoint(root, EXP)
    assert latest == os.path.join(root, f"{EXP}_step1")
    assert verify_checkpoint(latest)["step"] == 1
