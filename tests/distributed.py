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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, fn, args, out_dir, env):
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


def _failures(out_dir: str, world_size: int) -> str:
    """The tracebacks of every rank that reported an error so far ("" if none)."""
    found = []
    for rank in range(world_size):
        path = os.path.join(out_dir, f"rank{rank}.pt")
        if os.path.exists(path):
            try:
                rec = torch.load(path, weights_only=False)
            except Exception:  # still being written
                continue
            if not rec["ok"]:
                found.append(f"rank {rank} failed:\n{rec['error']}")
    return "\n".join(found)


def run_distributed(fn, world_size: int, args=(), env=None, timeout: float = 600.0):
    """A rank that fails while the others wait in a collective would hang them: the first failure
    (or the timeout) stops every rank and fails the caller with that rank's traceback."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker, args=(world_size, free_port(), fn, tuple(args), out_dir, dict(env or {})),
            nprocs=world_size, join=False, start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1.0):
            if _failures(out_dir, world_size) or time.monotonic() > deadline:
                time.sleep(2.0)  # let the peers of a failed rank report their side too
                for proc in ctx.processes:
                    proc.kill()
                raise AssertionError(_failures(out_dir, world_size)
                                     or f"{world_size} ranks did not finish within {timeout:.0f} s")
        failures = _failures(out_dir, world_size)
        if failures:
            raise AssertionError(failures)
        return [torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False)["result"]
                for rank in range(world_size)]
