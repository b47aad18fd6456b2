"""One run per run folder: ``<results_dir>/<exp_name>/run.lock``, taken at start-up, released at exit.

The lock file holds the owner (``pid``, ``host``, ``started``, the command) and is created with
``O_CREAT | O_EXCL``, so of two runs started on one folder at once exactly one gets it; the other
stops with exit code 2 naming the first. A lock whose process is gone (same host, pid dead: a
``kill -9``, a crash) is taken over with a one-line warning. Under torchrun rank 0 takes it and
tells the other ranks the outcome, so every rank stops alike.

    with RunLock(run_dir, is_main=info.is_main, report=print):
        ...  # check the folder, clean up, train

A ``checkpoint_dir`` outside the run folder, which runs of other results_dirs may share, gets a
lock of the experiment too (``<checkpoint_dir>/<exp_name>.lock``, ``experiment_lock_name``), so two
runs writing the same checkpoint names there cannot both start.
"""

import json
import os
import sys
import time
import uuid
from typing import Callable, Optional

from ..distributed.ranks import from_rank0
from ..errors import RunLockedError
from ..utils.processes import owner_alive, this_host

LOCK_FILE = "run.lock"


def experiment_lock_name(exp_name: str) -> str:
    return f"{exp_name}.lock"

EMPTY_LOCK_STALE_S = 10.0  # an empty lock file older than this was left by a crash mid-write


def _age(path: str) -> float:
    try:
        return time.time() - os.path.getmtime(path)
    except OSError:
        return 0.0


def _describe(owner: dict) -> str:
    started = owner.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {owner.get('pid')} on {owner.get('host')}, started {when}"


def _read(path: str) -> Optional[dict]:
    """The owner recorded in ``path``; {} when unreadable (being written, or damaged); None when gone."""
    try:
        with open(path) as f:
            owner = json.load(f)
        return owner if isinstance(owner, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


class RunLock:
    """The run folder's lock (a context manager; collective when entered under torchrun)."""

    def __init__(self, run_dir: str, is_main: bool = True, report: Callable[[str], None] = print,
                 name: str = LOCK_FILE):
        self.path = os.path.join(run_dir, name)
        self.is_main, self.report = is_main, report
        self.owner = {"pid": os.getpid(), "host": this_host(), "started": time.time(), "argv": sys.argv,
                      "token": uuid.uuid4().hex}
        self.held = False

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        self.held = True  # from here on, a stop signal or an error releases it
        with os.fdopen(fd, "w") as f:
            json.dump(self.owner, f)
        return True

    def _take_over(self, stale: dict) -> bool:
        """Move a dead owner's lock aside (one atomic rename: of several runs taking over at once,
        one wins) and create ours; False when it changed hands meanwhile."""
        aside = f"{self.path}.stale-{self.owner['token']}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return self._create()
        if _read(aside) != stale:  # another run took it over first: put its lock back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            os.remove(aside)
            return False
        os.remove(aside)
        return self._create()

    def _acquire(self) -> Optional[str]:
        """Take the lock (rank 0); the paragraph of the error when another live run holds it."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(50):
            if self._create():
                return None
            owner = _read(self.path)
            if owner is None:
                continue  # released meanwhile
            if not owner:  # being written by the other run this very moment, or left empty by a crash
                time.sleep(0.05)
                owner = _read(self.path)
                if owner is None:
                    continue
                if not owner and _age(self.path) > EMPTY_LOCK_STALE_S:  # never filled in: its writer is gone
                    if self._take_over({}):
                        self.report(f"warning: took over the unreadable lock {self.path} left by a crash")
                        return None
                    continue
            if owner and not owner_alive(int(owner.get("pid", -1)), str(owner.get("host"))):
                if self._take_over(owner):
                    self.report(f"warning: took over the lock {self.path} of a run that is gone ({_describe(owner)})")
                    return None
                continue
            who = _describe(owner) if owner else "an owner its lock file does not name"
            return (f"another run is using {os.path.dirname(self.path)!r} ({who}; lock file {self.path}). Wait for "
                    f"it to end or stop it, or choose another exp_name / results_dir / checkpoint_dir. If that "
                    f"process is gone, delete the lock file.")
        return f"could not take the lock {self.path}: it keeps changing hands; try again."

    def __enter__(self) -> "RunLock":
        try:
            problem = self._acquire() if self.is_main else None
            problem = from_rank0(problem)
        except BaseException:  # e.g. Ctrl-C while taking it
            self.release()
            raise
        if problem:
            raise RunLockedError(problem)
        return self

    def release(self) -> None:
        if self.held:
            self.held = False
            owner = _read(self.path)
            if owner is not None and owner.get("token", self.owner["token"]) == self.owner["token"]:
                os.remove(self.path)  # ours (or ours, interrupted while being written)

    def __exit__(self, *exc) -> None:
        self.release()

