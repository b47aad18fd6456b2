"""The run folder under faults: a full disk or a file-size limit during a save, litter of
interrupted saves, two runs on one folder, stop signals during start-up, and auto_resume when no
checkpoint verifies. Fault tests run train.py in a subprocess, bounded in time; the rest call its
``main`` in this process (as test_bad_inputs does)."""

import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from opendit_lite.checkpoint.catalog import list_checkpoints, verify_checkpoint
from opendit_lite.training.run_lock import LOCK_FILE
from tests.reliability.test_bad_inputs import ROOT, TINY, assert_one_paragraph, run_main, scripts  # noqa: F401

EXP = "t"
TIMEOUT = 120  # seconds any one subprocess may take


@pytest.fixture(scope="module")
def trained(tmp_path_factory, scripts):  # noqa: F811
    """A 2-step image run with checkpoints at steps 1 and 2 (copied by each test that changes it)."""
    out = str(tmp_path_factory.mktemp("trained"))
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        scripts["train"].main([*TINY, f"results_dir={out}", f"exp_name={EXP}", "max_steps=2", "ckpt_every=1"])
    finally:
        os.chdir(cwd)
    return out


def copy_run(trained, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(trained, out)
    return out, os.path.join(out, EXP, "checkpoints")


def train_args(results_dir, *more):
    return [*TINY, f"results_dir={results_dir}", f"exp_name={EXP}", *more]


def no_litter(ckpts):
    return [n for n in os.listdir(ckpts) if ".tmp-" in n or ".old-" in n]


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --------------------------------------------------------------------------------------------------
# 1. Saves that cannot fill the disk for good
# --------------------------------------------------------------------------------------------------

def _limit_file_size():
    """In the child before exec: files may not grow past 64 KiB, and the write that would makes the
    call fail with EFBIG (SIGXFSZ ignored) instead of killing the process."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def test_file_size_limit_during_a_save_then_a_retry_in_place(scripts, capsys, trained, tmp_path):  # noqa: F811
    out, ckpts = copy_run(trained, tmp_path)
    proc = subprocess.run([sys.executable, "train.py", *train_args(out, "max_steps=3", "auto_resume=true")],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=_limit_file_size)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert_one_paragraph(2, proc.stderr, f"saving '{ckpts}/{EXP}_step3' failed:")
    assert "The partial folder was removed and every complete checkpoint is kept (the newest is step 2)" in proc.stderr
    assert no_litter(ckpts) == [] and not os.path.exists(os.path.join(out, EXP, LOCK_FILE))
    for _, path in list_checkpoints(ckpts, EXP):
        verify_checkpoint(path)
    # Room again: the same command continues from step 2.
    code, err = run_main(scripts, capsys, "train", *train_args(out, "max_steps=3", "auto_resume=true"))
    assert code == 0, err
    assert f"{EXP}_step2 at step 2" in err
    assert list_checkpoints(ckpts, EXP)[-1][0] == 3


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_file_size_limit_during_a_two_rank_save(trained, tmp_path, ranks):
    """Under torchrun every rank learns that rank 0 could not write the model, rank 0 says why, and
    every rank ends with exit code 2, no traceback (the 1-process checkpoints resume at 2 and 4 ranks).
    Every part on every rank: tests/checkpoint/test_save_failures.py."""
    out, ckpts = copy_run(trained, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(ranks), "train.py", *train_args(out, "max_steps=3", "auto_resume=true")],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT * ranks // 2,
                          preexec_fn=_limit_file_size, env=dict(os.environ, OMP_NUM_THREADS="1"))
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and text.count("exitcode  : 2 ") >= 1, text  # torchrun's summary
    assert not re.search(r"exitcode  : (?!2 )", text), text  # no rank ended otherwise
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"saving '{ckpts}/{EXP}_step3' failed: " in errors[0], text
    assert "(writing the model on rank 0)" in errors[0], text
    frames = [line for line in text.splitlines() if 'File "' in line]  # "[rank1]:   File ..." included
    assert not [f for f in frames if "opendit_lite" in f or "train.py" in f], text
    assert no_litter(ckpts) == [] and not os.path.exists(os.path.join(out, EXP, LOCK_FILE))
    assert [s for s, _ in list_checkpoints(ckpts, EXP)] == [1, 2]


def test_a_write_without_room_in_atomic_path_is_a_storage_error(tmp_path):
    """LiteGen's save_* files go through atomic_path too: no room ends as StorageError, no partial file."""
    import errno

    from opendit_lite.checkpoint.files import atomic_path
    from opendit_lite.errors import StorageError

    with pytest.raises(StorageError, match=r"writing '.*model\.pth' failed: No space left on device; the partial"):
        with atomic_path(str(tmp_path / "model.pth")) as tmp:
            open(tmp, "w").close()
            raise OSError(errno.ENOSPC, "No space left on device")
    assert os.listdir(tmp_path) == []


def test_no_room_before_a_save_stops_naming_the_bytes(scripts, capsys, trained, tmp_path, monkeypatch):  # noqa: F811
    out, ckpts = copy_run(trained, tmp_path)
    monkeypatch.setattr("opendit_lite.checkpoint.save_restore._free_bytes", lambda folder: 1000)
    code, err = run_main(scripts, capsys, "train", *train_args(out, "max_steps=3", "auto_resume=true"))
    need = sum(r["size"] for r in verify_checkpoint(f"{ckpts}/{EXP}_step2")["files"].values())
    assert_one_paragraph(code, err, f"no room to save step 3 in '{ckpts}': it has 1000 bytes free and the previous "
                                    f"checkpoint {ckpts}/{EXP}_step2 takes {need} bytes")
    assert no_litter(ckpts) == [] and [s for s, _ in list_checkpoints(ckpts, EXP)] == [1, 2]


# --------------------------------------------------------------------------------------------------
# 2. No litter   3. One run per folder
# --------------------------------------------------------------------------------------------------

def test_start_up_removes_only_dead_owners_tmp_folders(scripts, capsys, trained, tmp_path):  # noqa: F811
    out, ckpts = copy_run(trained, tmp_path)
    host = socket.gethostname()
    dead = f"{EXP}_step7.tmp-0123456789ab-{dead_pid()}@{host}"
    legacy = f"{EXP}_step8.tmp-0123456789ab"                        # written before owners were stamped
    live = f"{EXP}_step9.tmp-0123456789ab-{os.getpid()}@{host}"     # a save in progress elsewhere
    other_host = f"{EXP}_step9.tmp-abcdef012345-{dead_pid()}@not-{host}"
    other_run = f"other_step1.tmp-0123456789ab-{dead_pid()}@{host}"
    litegen_file = f"{EXP}_step7.optim_state.pth.tmp-0123456789ab-{dead_pid()}@{host}"
    for name in (dead, legacy, live, other_host, other_run):
        os.makedirs(os.path.join(ckpts, name, "model"))
    open(os.path.join(ckpts, litegen_file), "w").close()
    code, err = run_main(scripts, capsys, "train", *train_args(out, "max_steps=2", "auto_resume=true"))
    assert code == 0, err
    assert sorted(no_litter(ckpts)) == sorted([live, other_host, other_run])
    lines = [line for line in err.splitlines() if "temporary folder(s) left by interrupted saves" in line]
    assert len(lines) == 1 and "removed 3 " in lines[0] and dead in lines[0] and legacy in lines[0], err


def test_a_second_run_on_the_folder_stops_naming_the_first(tmp_path):
    """Runs started on one folder at once: exactly one takes the lock (O_CREAT | O_EXCL); the others
    are told which process holds it. The children import first, then start together on a signal file."""
    run_dir, go = str(tmp_path / "run"), tmp_path / "go"
    child = ("import os, sys, time; from opendit_lite.training.run_lock import RunLock\n"
             f"open({str(tmp_path)!r} + '/ready-' + str(os.getpid()), 'w').close()\n"
             f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
             f"lock = RunLock({run_dir!r}, report=lambda line: None)\n"
             "try:\n"
             "    lock.__enter__()\n"
             "except Exception as e:\n"
             "    print('refused:', e); sys.exit(2)\n"
             "print('took'); sys.stdout.flush(); time.sleep(1.5); lock.release()\n")
    procs = [subprocess.Popen([sys.executable, "-c", child], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    deadline = time.time() + TIMEOUT
    while len([n for n in os.listdir(tmp_path) if n.startswith("ready-")]) < 2 and time.time() < deadline:
        time.sleep(0.05)
    go.touch()
    results = [(p.wait(timeout=TIMEOUT), p.stdout.read(), p.stderr.read()) for p in procs]
    winners = [proc for proc, r in zip(procs, results) if r[0] == 0]
    assert len(winners) == 1, results
    for code, text, _ in results:
        if code != 0:
            assert f"another run is using '{run_dir}' (pid {winners[0].pid} on {socket.gethostname()}" in text
    assert not os.path.exists(os.path.join(run_dir, LOCK_FILE))  # released


def test_train_refuses_a_live_lock_and_takes_over_a_stale_one(scripts, capsys, trained, tmp_path):  # noqa: F811
    import json

    out, ckpts = copy_run(trained, tmp_path)
    lock = os.path.join(out, EXP, LOCK_FILE)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(lock, "w") as f:
            json.dump({"pid": holder.pid, "host": socket.gethostname(), "started": time.time()}, f)
        code, err = run_main(scripts, capsys, "train", *train_args(out, "max_steps=3", "auto_resume=true"))
        assert_one_paragraph(code, err, f"another run is using '{out}/{EXP}' (pid {holder.pid} on "
                                        f"{socket.gethostname()}, started ")
        assert os.path.exists(lock) and [s for s, _ in list_checkpoints(ckpts, EXP)] == [1, 2]
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone: its lock is stale.
    code, err = run_main(scripts, capsys, "train", *train_args(out, "max_steps=3", "auto_resume=true"))
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "took over the lock" in line]
    assert len(warnings) == 1 and f"pid {holder.pid}" in warnings[0], err
    assert not os.path.exists(lock)  # released at exit


def test_a_shared_checkpoint_dir_is_locked_per_experiment(scripts, capsys, tmp_path):  # noqa: F811
    """Runs of different results_dirs writing one checkpoint_dir: the experiment's lock there stops
    the second, as the run folder's lock does."""
    import json

    shared = tmp_path / "shared"
    shared.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (shared / f"{EXP}.lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                        "started": time.time()}))
        code, err = run_main(scripts, capsys, "train", *train_args(tmp_path / "b", "max_steps=1"),
                             f"checkpoint_dir={shared}")
        assert_one_paragraph(code, err, f"another run is using '{shared}' (pid {holder.pid} on ")
        assert not (tmp_path / "b" / EXP / LOCK_FILE).exists()  # the run folder's lock was released too
    finally:
        holder.kill()
        holder.wait()


# --------------------------------------------------------------------------------------------------
# 4. Signals at any time; auto_resume that finds nothing that verifies
# --------------------------------------------------------------------------------------------------

def _signal_when(tmp_path, ready, sig=signal.SIGTERM):
    """Start train.py, send ``sig`` once ``ready(pid)`` holds; (exit code, stderr, seconds to exit)."""
    proc = subprocess.Popen([sys.executable, "train.py", *train_args(tmp_path, "max_steps=100000", "log_every=1000")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + TIMEOUT
    while not ready(proc.pid) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    sent = time.time()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out + err, time.time() - sent


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has put a handler of its own in place for ``sig`` (the SigCgt mask of
    /proc/<pid>/status): the script's first statement does, before it imports anything else."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(mask, 16) >> (sig - 1) & 1)


def _has_mapped(pid: int, library: str) -> bool:
    """Whether process ``pid`` has ``library`` (a shared object's name) in its memory map."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return library in f.read()
    except OSError:
        return False


def _after_the_handler(delay: float):
    """A ``ready(pid)`` that holds ``delay`` seconds after the process was first seen catching SIGTERM."""
    seen = []

    def ready(pid: int) -> bool:
        if not seen and _catches(pid, signal.SIGTERM):
            seen.append(time.time())
        return bool(seen) and time.time() > seen[0] + delay

    return ready


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/status"), reason="reads a process's signals from /proc")
def test_sigterm_during_the_imports_exits_130_at_once(tmp_path):
    """"During the imports" is any moment from the script's first statement, which puts the stop
    handler in place, to the run holding its folder: the config's checks, then torch, timm and
    Colossal-AI. The moments are read from the process itself, not from a clock, so a loaded machine
    changes nothing: as soon as the handler is in place (the config not yet read), once torch's
    library is being loaded, and at fixed delays after the handler. (A signal before the
    interpreter reaches the first statement meets the default action, death by the signal, with
    nothing written; no code of the script can run that early.)"""
    moments = {
        "handler in place": lambda pid: _catches(pid, signal.SIGTERM),
        "torch loading": lambda pid: _catches(pid, signal.SIGTERM) and _has_mapped(pid, "libtorch"),
        "0.5 s after the handler": _after_the_handler(0.5),
        "1.5 s after the handler": _after_the_handler(1.5),
    }
    for name, ready in moments.items():
        code, err, took = _signal_when(tmp_path / name.replace(" ", "_"), ready)
        assert code == 130 and "Traceback" not in err, (name, code, err)
        assert len([line for line in err.splitlines() if line.startswith("stopped:")]) == 1, (name, err)
        ckpts = tmp_path / name.replace(" ", "_") / EXP / "checkpoints"
        assert took < 15 and (not ckpts.exists() or os.listdir(ckpts) == []), (name, took, err)


def test_sigterm_during_start_up_exits_130_without_partial_files(tmp_path):
    """The signal arrives once the run holds its folder (lock taken, nothing trained yet)."""
    lock = tmp_path / EXP / LOCK_FILE
    code, err, took = _signal_when(tmp_path, lambda pid: lock.exists())
    assert code == 130 and "Traceback" not in err, err
    assert "stopped: interrupted before a checkpoint was written" in err and took < 30, (took, err)
    assert not lock.exists()
    ckpts = tmp_path / EXP / "checkpoints"
    assert not ckpts.exists() or os.listdir(ckpts) == []


def test_auto_resume_when_no_checkpoint_verifies(scripts, capsys, trained, tmp_path):  # noqa: F811
    out, ckpts = copy_run(trained, tmp_path)
    with open(os.path.join(ckpts, f"{EXP}_step1", "meta.json"), "w") as f:
        f.write("{ not json")
    model_dir = os.path.join(ckpts, f"{EXP}_step2", "model")
    shard = next(n for n in sorted(os.listdir(model_dir)) if n.endswith(".safetensors"))
    with open(os.path.join(model_dir, shard), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    code, err = run_main(scripts, capsys, "train", *train_args(out, "max_steps=2", "auto_resume=true"))
    assert_one_paragraph(code, err, f"no checkpoint of experiment '{EXP}' under '{ckpts}' verifies: "
                                    f"{EXP}_step1, {EXP}_step2")
    assert "set overwrite=true to start afresh" in err
    code, err = run_main(scripts, capsys, "train", *train_args(out, "max_steps=1", "auto_resume=true",
                                                                "overwrite=true"))
    assert code == 0, err
    verify_checkpoint(os.path.join(ckpts, f"{EXP}_step1"))


def _children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and f.read().rsplit(")", 1)[1].split()[1] == str(pid):
                    kids.append(int(entry))
        except (OSError, IndexError):
            continue
    return kids


def _sigterm_torchrun_ranks(tmp_path, ready, pause):
    """Start a 2-rank torchrun run, SIGTERM its ranks ``pause`` s after ``ready()`` holds; checks that
    every rank ends with exit code 130 (torchrun's summary lists each), one paragraph, no traceback
    from the run, the lock released; returns the paragraph."""
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "train.py", *train_args(tmp_path, "max_steps=100000", "log_every=1000")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + TIMEOUT
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(pause)
    ranks = _children(proc.pid)
    assert len(ranks) == 2, ranks
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT)
    text = out + err
    assert proc.returncode != 0 and text.count("exitcode  : 130") == 2, text   # torchrun's summary, per rank
    stopped = [line for line in text.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1, text
    frames = [line for line in text.splitlines() if 'File "' in line]  # "[rank1]:   File ..." included
    assert not [f for f in frames if "opendit_lite" in f or "train.py" in f], text
    assert "KeyboardInterrupt" not in text, text
    assert not (tmp_path / EXP / LOCK_FILE).exists()
    return stopped[0]


@pytest.mark.slow
def test_sigterm_to_a_two_rank_torchrun_run_saves_and_every_rank_exits_130(tmp_path):
    """A scheduler's SIGTERM to the ranks of a torchrun run: they agree on a step, save once, and
    each rank ends with exit code 130 (torchrun, stopping the rank still exiting once the other has
    ended, does not turn that into a kill)."""
    stopped = _sigterm_torchrun_ranks(tmp_path, (tmp_path / EXP / "config.yaml").exists, pause=1.0)
    assert "a stop signal was honoured at step" in stopped
    ckpts = tmp_path / EXP / "checkpoints"
    assert len(list_checkpoints(str(ckpts), EXP)) == 1 and no_litter(str(ckpts)) == []


@pytest.mark.slow
def test_sigterm_to_a_two_rank_torchrun_run_during_start_up(tmp_path):
    """The ranks stopped the moment rank 0 holds the lock: exit code 130 on each, nothing saved."""
    stopped = _sigterm_torchrun_ranks(tmp_path, (tmp_path / EXP / LOCK_FILE).exists, pause=0.0)
    assert "interrupted before a checkpoint was written" in stopped
    ckpts = tmp_path / EXP / "checkpoints"
    assert not ckpts.exists() or os.listdir(ckpts) == []
