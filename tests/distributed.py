"""Run a function on N gloo ranks in fresh processes and collect each rank's return value.

    results = run_distributed(fn, world_size=2, args=(...))   # list indexed by rank

``fn(rank, world_size, *args)`` runs after ``torch.distributed`` is initialised (gloo, localhost);
its return value must be picklable. An exception on any rank fails the caller with that rank's
traceback.
"""

import os
import socket
import tempfile
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


def run_distributed(fn, world_size: int, args=(), env=None):
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _worker, args=(world_size, free_port(), fn, tuple(args), out_dir, dict(env or {})),
            nprocs=world_size, join=True, start_method="spawn",
        )
        results = []
        for rank in range(world_size):
            rec = torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False)
            if not rec["ok"]:
                raise AssertionError(f"rank {rank} failed:\n{rec['error']}")
            results.append(rec["result"])
        return results
