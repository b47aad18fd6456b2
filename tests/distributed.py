"""Run a function on N gloo ranks in fresh processes and collect each rank's return value.

    results = run_distributed(fn, world_size=2, args=(...))   # list indexed by rank

``fn(rank, world_size, *args)`` runs after ``torch.distributed`` is initialised (gloo, localhost);
its return value must be picklable. An exception on any rank stops all ranks and fails the caller
with that rank's traceback.
"""

import os
import socket
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The ranks start from a fork server (one per test process, started at the first spawn) that has
# imported torch, Colossal-AI, timm and diffusers once: a rank starts in a fraction of a second where
# a fresh interpreter takes seconds to import them. The server forks before any of them has run an
# op, and each rank is a fresh process as with "spawn": the test's own state (monkeypatches, imported
# test modules) is not inherited; the caller's environment is passed on explicitly (``_worker``).
PRELOAD = ["torch", "torch.distributed", "colossalai.booster", "timm", "diffusers", "opendit_lite"]
mp.set_forkserver_preload(PRELOAD)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, fn, args, out_dir, env):
    os.environ.clear()  # the caller's environment at the spawn, not the fork server's at its start
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    path = os.path.join(out_dir, f"rank{rank}.pt")
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        torch.save({"ok": True, "result": result}, path)
    except BaseException:  # report every failure, including assertion errors, to the parent
        torch.save({"ok": False, "error": traceback.format_exc()}, path)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _read(out_dir: str, rank: int):
    """The record rank ``rank`` saved ({"ok": ..., ...}), or None when it has not saved one (yet)."""
    path = os.path.join(out_dir, f"rank{rank}.pt")
    if not os.path.exists(path):
        return None
    try:
        return torch.load(path, weights_only=False)
    except Exception:  # still being written
        return None


def _failures(out_dir: str, world_size: int) -> str:
    """The tracebacks of every rank that reported an error so far ("" if none)."""
    found = []
    for rank in range(world_size):
        rec = _read(out_dir, rank)
        if rec is not None and not rec["ok"]:
            found.append(f"rank {rank} failed:\n{rec['error']}")
    return "\n".join(found)


def _problems(ctx, out_dir: str, world_size: int, killed: bool = False) -> str:
    """Every rank's reported error, and the ranks that exited without a record (those we ``killed``
    after a failure excepted)."""
    died = [rank for rank, proc in enumerate(ctx.processes) if proc.exitcode is not None
            and not (killed and proc.exitcode == -9) and _read(out_dir, rank) is None]
    reasons = [_failures(out_dir, world_size)]
    if died:
        reasons.append(f"rank(s) {died} exited without a result (exit codes "
                       f"{[ctx.processes[r].exitcode for r in died]})")
    return "\n".join(r for r in reasons if r)


def _run_once(fn, world_size: int, args, env, timeout: float, out_dir: str):
    ctx = mp.start_processes(
        _worker, args=(world_size, free_port(), fn, tuple(args), out_dir, {**os.environ, **(env or {})}),
        nprocs=world_size, join=False, start_method="forkserver",
    )
    deadline = time.monotonic() + timeout
    while any(proc.is_alive() for proc in ctx.processes):
        if _problems(ctx, out_dir, world_size) or time.monotonic() > deadline:
            time.sleep(2.0)  # let the peers of a failed rank report their side too
            for proc in ctx.processes:
                proc.kill()
            raise AssertionError(_problems(ctx, out_dir, world_size, killed=True)
                                 or f"{world_size} ranks did not finish within {timeout:.0f} s")
        ctx.processes[0].join(timeout=1.0)
    # Every rank has exited. One that saved an ok result has succeeded whatever its exit status: at
    # interpreter exit a rank sometimes aborts ("terminate called without an active exception",
    # SIGABRT) in a library's thread teardown, after its work and its record are complete.
    problems = _problems(ctx, out_dir, world_size)
    if problems:
        raise AssertionError(problems)
    return [_read(out_dir, rank)["result"] for rank in range(world_size)]


def run_distributed(fn, world_size: int, args=(), env=None, timeout: float = 600.0):
    """A rank that fails while the others wait in a collective would hang them: the first failure
    (or the timeout) stops every rank and fails the caller with that rank's traceback. A run whose
    rendezvous port was taken in the meantime (another test process picked the same free port) is
    started once more on a new port."""
    for attempt in range(2):
        with tempfile.TemporaryDirectory() as out_dir:
            try:
                return _run_once(fn, world_size, args, env, timeout, out_dir)
            except AssertionError as e:
                if attempt == 0 and ("EADDRINUSE" in str(e) or "Address already in use" in str(e)):
                    continue
                raise


def _script_rank(rank: int, world_size: int, script: str, argv, cwd: str):
    """One rank of ``run_script_on_ranks``: the script's ``main(argv)`` in this rank's process group, as
    torchrun would start it; returns (exit code, main's return value)."""
    import runpy

    os.chdir(cwd)
    module = runpy.run_path(os.path.join(cwd, script), run_name=f"rank_{os.path.basename(script)[:-3]}")
    try:
        return 0, module["main"](list(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1, None


def run_script_on_ranks(script: str, argv, world_size: int = 2, cwd: str = None, env=None,
                        timeout: float = 600.0) -> list:
    """A script's ``main`` on ``world_size`` gloo ranks started as ``run_distributed`` starts them (from
    the preloaded fork server), in place of ``torchrun --nproc_per_node world_size script argv`` where a
    test checks what the ranks compute (losses, samples, files) rather than torchrun itself; the
    entry points' torchrun smoke tests keep the launcher's own behaviour covered. Returns
    ``[(exit code, main's return value)]`` per rank."""
    cwd = cwd or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return run_distributed(_script_rank, world_size, args=(script, list(argv), cwd),
                           env={"OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout)
