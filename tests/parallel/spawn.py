"""One spawn per world size for all of tests/parallel.

Starting gloo ranks costs more than the checks they run (each process imports torch, timm and, for
the plugin, Colossal-AI; four of them share two cores), so the test modules register their
per-rank check functions here and the first test that needs a world size runs every function
registered for it in one spawn. Pytest imports all test modules before running any test, so a
spawn includes every module selected for the session. Under pytest-xdist the workers of one run
collect the same modules, so the spawn runs once per run, not once per worker: the first worker to
need it runs it under a file lock and leaves its results (or its failure) for the others::

    @rank_checks("collectives", world_size=2)
    def _checks(rank, world_size) -> dict: ...          # runs on each rank; returns picklable data

    results("collectives", 2)                            # that function's return value, per rank
"""

import functools
import hashlib
import os
import pickle
import tempfile
from typing import Callable, Dict, List, Tuple

from filelock import FileLock

from tests.distributed import run_distributed

_CHECKS: Dict[Tuple[str, int], Callable] = {}


def rank_checks(name: str, world_size: int) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        if (name, world_size) in _CHECKS:
            raise ValueError(f"rank checks {name!r} for world size {world_size} are already registered")
        _CHECKS[(name, world_size)] = fn
        return fn

    return register


def _run_all(rank: int, world_size: int, checks: Tuple[Tuple[str, Callable], ...]) -> dict:
    return {name: fn(rank, world_size) for name, fn in checks}


def _shared_file(world_size: int, names: Tuple[str, ...]) -> str:
    """Where this run's workers share the ``world_size`` spawn (one pytest run: xdist's run id, else this
    process)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    key = hashlib.sha1(repr((run, world_size, names)).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"opendit_lite_rank_checks_{key}.pkl")


@functools.lru_cache(maxsize=None)
def _spawn(world_size: int) -> List[dict]:
    checks = tuple((name, fn) for (name, size), fn in _CHECKS.items() if size == world_size)
    path = _shared_file(world_size, tuple(name for name, _ in checks))
    with FileLock(path + ".lock"):
        if not os.path.exists(path):
            try:
                record = {"ok": True, "results": run_distributed(_run_all, world_size, args=(checks,))}
            except AssertionError as e:
                record = {"ok": False, "error": str(e)}
            with open(path + ".tmp", "wb") as f:
                pickle.dump(record, f)
            os.replace(path + ".tmp", path)
        with open(path, "rb") as f:
            record = pickle.load(f)
    if not record["ok"]:
        raise AssertionError(record["error"])
    return record["results"]


def results(name: str, world_size: int) -> list:
    """The return value of the ``name`` checks on each rank of the shared ``world_size`` spawn."""
    if (name, world_size) not in _CHECKS:
        raise KeyError(f"no rank checks {name!r} registered for world size {world_size}")
    return [per_rank[name] for per_rank in _spawn(world_size)]
