"""A save whose write fails on some rank, because the disk is full, a file-size limit is hit or its
partial folder disappeared, ends on every rank with the same StorageError (exit code 2 in the
scripts) right after the part that failed: the model, the optimizer state, the LR scheduler, the
EMA, the RNG states, the fp32 master shards or the metadata. No rank hangs in a collective, no
partial folder is left, and the ranks stay in step: the next save of the same processes succeeds.

The failures are real: the failing rank lowers its own file-size limit (RLIMIT_FSIZE, SIGXFSZ
ignored) just before the part's write, so torch.save, safetensors and Colossal-AI's checkpoint IO
fail the way a full disk makes them fail.
"""

import errno
import os
import re
import resource
import shutil
import signal
from contextlib import contextmanager

import pytest
import torch
import torch.nn as nn

from opendit_lite.checkpoint import files, save_restore
from opendit_lite.checkpoint.catalog import list_checkpoints, verify_checkpoint
from opendit_lite.checkpoint.write_failures import classify, deferred_write_failures
from opendit_lite.errors import CheckpointError, StorageError
from tests.checkpoint.test_state import run_on_cpu
from tests.zero_cpu_shim import install as install_zero_cpu_shim

SMALL = 16  # bytes: every file of a checkpoint is larger
EXP = "f"


# --------------------------------------------------------------------------------------------------
# In this process: what a failed write means, and deferred failures
# --------------------------------------------------------------------------------------------------

def test_failures_are_classified_as_the_storage_a_removed_folder_or_a_defect():
    assert classify(OSError(errno.ENOSPC, "No space left on device"), False) == ("storage", "No space left on device")
    assert classify(RuntimeError("File too large (os error 27)"), False)[0] == "storage"  # safetensors
    assert classify(RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 12"),
                    False)[0] == "storage"  # torch's zip writer
    gone = RuntimeError("Parent directory /x/f_step3.tmp-abc/rng does not exist.")  # torch.save
    assert classify(gone, True)[0] == "gone"
    assert classify(gone, False)[0] == "error"  # the copy is still there: a defect of the writer
    assert classify(ValueError("bad"), True) == ("error", "ValueError: bad")


def test_deferred_writes_record_the_first_storage_failure_and_skip_the_rest(tmp_path, monkeypatch):
    calls = []

    def full_disk(obj, path, *args, **kwargs):
        calls.append(path)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with deferred_write_failures() as deferred:
        torch.save({}, "a")
        torch.save({}, "b")  # skipped: the copy is lost already
    assert calls == ["a"] and deferred.error.errno == errno.ENOSPC
    assert torch.save is full_disk  # restored

    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(TypeError("cannot pickle")))
    with pytest.raises(TypeError, match="cannot pickle"):  # not the storage's: raised at once
        with deferred_write_failures():
            torch.save({}, "c")


def test_one_process_save_into_a_removed_partial_folder_is_abandoned(tmp_path):
    final = str(tmp_path / "step3")
    with pytest.raises(StorageError, match="was abandoned: its partial folder was removed") as info:
        with files.collective_write(final) as copy:
            copy.step("folders", lambda: os.makedirs(os.path.join(copy.path, "rng")))
            files.remove_path(copy.path)  # what another process's clean-up does
            copy.step("RNG state", lambda: torch.save({"x": 1}, os.path.join(copy.path, "rng", "rank00000.pt")))
    assert isinstance(info.value.__cause__, RuntimeError)
    assert os.listdir(tmp_path) == []


def test_other_failures_keep_their_own_error_and_take_the_partial_copy_along(tmp_path):
    final = str(tmp_path / "step3")
    with pytest.raises(ValueError, match="not a storage fault"):
        with files.atomic_path(final) as tmp:
            os.makedirs(tmp)
            raise ValueError("not a storage fault")
    with pytest.raises(RuntimeError, match="does not exist"):  # never created: the writer's own defect
        with files.atomic_path(final) as tmp:
            torch.save({"x": 1}, os.path.join(tmp, "rng", "rank00000.pt"))
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------------
# Spawned ranks: every part of a real save (DDP, and ZeRO-2 whose optimizer shards interleave gathers
# with rank 0's writes), failing on each rank that writes it
# --------------------------------------------------------------------------------------------------

@contextmanager
def _file_size_limit(armed: bool):
    """Lower this process's file-size limit to SMALL bytes (when ``armed``) until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        yield lambda: armed and resource.setrlimit(resource.RLIMIT_FSIZE, (SMALL, hard))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _setup(zero_degree):
    from colossalai.booster import Booster

    from opendit_lite.plugins import OpenDiTPlugin

    install_zero_cpu_shim()
    plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="fp32")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
    optimizer = plugin.build_optimizer(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=4)
    booster = Booster(plugin=plugin)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    plugin.create_ema(model)
    booster.backward(model(torch.randn(4, 6)).square().mean(), optimizer)  # optimizer state to save
    optimizer.step()
    optimizer.zero_grad()
    return booster, model, optimizer, scheduler, plugin


def _wrap(patches, target, name, before):
    original = getattr(target, name)
    patches.append((target, name, original))

    def wrapper(*args, **kwargs):
        out = before(original, *args, **kwargs)
        return out
    setattr(target, name, wrapper)


@contextmanager
def _fault(part, armed, parts, root):
    """Make this rank's write of ``part`` fail (when ``armed``): a file-size limit hit, the partial
    folder removed by someone else ("gone"), or a defect ("defect")."""
    booster, _, _, _, plugin = parts
    patches = []
    with _file_size_limit(armed) as limit:
        def limited(original, *args, **kwargs):
            out = original(*args, **kwargs)  # the EMA's gather and the RNG snapshot first, then the write
            limit()
            return out

        def before(original, *args, **kwargs):
            limit()
            return original(*args, **kwargs)

        def remove_partial(original, *args, **kwargs):
            if armed:
                for name in os.listdir(root):
                    if ".tmp-" in name:
                        shutil.rmtree(os.path.join(root, name))
            return original(*args, **kwargs)

        def defect(original, *args, **kwargs):
            if armed:
                raise TypeError("a defect in the writer")
            return original(*args, **kwargs)

        where = {"model": (booster, "save_model", before), "optimizer state": (booster, "save_optimizer", before),
                 "LR scheduler": (booster, "save_lr_scheduler", before), "EMA": (plugin.ema, "state_dict", limited),
                 "RNG state": (save_restore, "get_rng_state", limited),
                 "metadata": (save_restore, "manifest", limited),
                 "gone": (save_restore, "get_rng_state", remove_partial),
                 "defect": (save_restore, "get_rng_state", defect)}[part]
        _wrap(patches, *where)
        try:
            yield
        finally:
            for target, name, original in reversed(patches):
                setattr(target, name, original)


def _save(parts, root, step):
    booster, model, optimizer, scheduler, plugin = parts
    return save_restore.save_checkpoint(booster, root, step, model, optimizer, scheduler, ema=plugin.ema,
                                            exp_name=EXP)


def _failing_saves(rank, world, root, zero, cases, small_shards):
    """Each case ``(part, failing rank)`` is one save at step 100+i; returns per case what this rank
    raised (class name, message) and, on rank 0, the litter left once it raised; then one save that
    must succeed."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    parts = _setup(zero)
    booster = parts[0]
    if small_shards:  # many optimizer shards: rank 0's shard writes interleave with every rank's gathers
        save_optimizer = booster.save_optimizer
        booster.save_optimizer = lambda *a, **k: save_optimizer(*a, **dict(k, size_per_shard=0))
    out = []
    for i, (part, bad_rank) in enumerate(cases):
        with _fault(part, rank == bad_rank, parts, root):
            try:
                _save(parts, root, 100 + i)
                raised = None
            except (StorageError, CheckpointError, TypeError) as e:
                raised = (type(e).__name__, str(e))
        litter = [n for n in os.listdir(root) if ".tmp-" in n] if rank == 0 else []
        out.append((raised, litter))
    return out, _save(parts, root, 1)


def _check(results, cases, root, world):
    for i, (part, bad_rank) in enumerate(cases):
        raised = [per_rank[0][i][0] for per_rank in results]
        raised = [r and (r[0], re.sub(r"has \d+ bytes free", "has N bytes free", r[1])) for r in raised]
        litter = results[0][0][i][1]
        assert litter == [], (part, litter)
        if part == "defect":
            assert raised[bad_rank][0] == "TypeError", raised
            others = [r for k, r in enumerate(raised) if k != bad_rank]
            expected = f"rank {bad_rank} failed (writing the RNG state) with TypeError"
            assert all(r[0] == "CheckpointError" and expected in r[1] for r in others), raised
            continue
        assert len(set(raised)) == 1, f"{part} on rank {bad_rank}: the ranks disagree: {raised}"
        kind, text = raised[0]
        assert kind == "StorageError", raised
        if part == "gone":
            assert "was abandoned: its partial folder was removed while it was written" in text, text
        else:
            # torch's zip writer reports a short write without its errno
            assert re.match(rf"saving '{root}/{EXP}_step{100 + i}' failed: (File too large|a write came up short "
                            rf"\(a full disk or a file-size limit\)) \(writing the {part} on rank {bad_rank}\)\. The "
                            rf"partial folder was removed", text), text
    assert [s for s, _ in list_checkpoints(root, EXP)] == [1]  # only the save that succeeded
    verify_checkpoint(results[0][1])
    assert all(r[1] == results[0][1] for r in results)


# Parts rank 0 alone writes (the checkpoint IO's files, the EMA, the metadata), and those every rank does.
RANK0_PARTS = ("model", "optimizer state", "LR scheduler", "EMA", "metadata")


def test_two_ranks_every_part_and_twenty_failing_saves_in_a_row(tmp_path):
    cases = [(part, 0) for part in RANK0_PARTS] + [("RNG state", 0), ("RNG state", 1), ("gone", 1), ("defect", 1)]
    cases += [("RNG state", i % 2) for i in range(20)]  # the race of a removed folder cannot come back
    root = str(tmp_path)
    results = run_on_cpu(_failing_saves, 2, (root, 0, cases, False))
    _check(results, cases, root, 2)


@pytest.mark.slow  # four ranks importing Colossal-AI on two cores: about 25 s of start-up
def test_four_ranks_under_zero_with_interleaved_optimizer_shards(tmp_path):
    cases = [(part, 0) for part in RANK0_PARTS] + [("RNG state", 3), ("RNG state", 2), ("gone", 1), ("defect", 2)]
    root = str(tmp_path)
    results = run_on_cpu(_failing_saves, 4, (root, 2, cases, True))
    _check(results, cases, root, 4)
