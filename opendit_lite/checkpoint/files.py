"""Atomic publication of files and folders, and loading that never unpickles arbitrary objects.

A checkpoint (or a LiteGen ``save_*`` file) is written under ``<name>.tmp-<uid>-<pid>@<host>`` (rank
0's process id and host: ``litter.py`` removes the ones whose owner died) and renamed to its final
name by rank 0 once every rank has written its part, so a process killed midway leaves only the
``*.tmp-*`` name, which no reader takes for a checkpoint. The ranks agree after each part they
write (``PartialCopy``), so a write that fails on one rank ends the save the same way on all of
them, and the partial copy is removed only once none is writing into it. Torch files are read
with ``weights_only`` forced on, also inside library loaders we do not own (Colossal-AI's).
"""

import os
import pickle
import re
import shutil
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..distributed.ranks import from_rank0, global_rank, global_world_size, peer_lost
from ..errors import CheckpointError, StorageError
from ..utils.processes import owner_stamp
from .write_failures import classify, deferred_write_failures, storage_failure

TMP_TAG = ".tmp-"
OLD_TAG = ".old-"  # a complete checkpoint moved aside while a re-save of its step is published
# Which failure every rank reports when several ranks' writes failed: the storage's own reason first.
_PRIORITY = ("storage", "error", "gone")


def remove_path(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _remove_quietly(path: str) -> None:
    for _ in range(3):  # a second pass takes what a concurrent writer added during the first
        try:
            remove_path(path)
        except OSError:
            continue
        if not os.path.lexists(path):
            return


class WriteFailed(StorageError):
    """Every rank's error when a write of a collective save failed on some rank for want of room or
    because its partial folder disappeared: the same text on every rank, with the failure's parts."""

    def __init__(self, message: str, final: str, rank: int, what: str, kind: str, reason: str):
        super().__init__(message)
        self.final, self.rank, self.what, self.kind, self.reason = final, rank, what, kind, reason

    def cause(self, world_size: int) -> str:
        """The failure in words, e.g. "File too large (writing the RNG state on rank 1)"."""
        return self.reason + _part(self.what, self.rank, world_size)


def _part(what: Optional[str], rank: int, world_size: int) -> str:
    where = f" on rank {rank}" if world_size > 1 else ""
    return f" (writing the {what}{where})" if what else (f" ({where.strip()})" if where else "")


class PartialCopy:
    """The temporary copy (``path``) a collective write fills, step by step.

    Every write goes through :meth:`step` (or :meth:`writing`): the step's storage and missing-folder
    failures are deferred to its end (see ``write_failures``), then every rank tells the others
    how its step went (one ``all_gather_object``; after a failure a second one, once every rank's
    write is over, says what each failure was), and all of them leave the step the same way: on
    with the next step, or raising the same :class:`WriteFailed`. Only after that agreement does
    rank 0 remove the partial copy, so no rank ever finds the folder gone under a write of its own,
    and no rank waits in a collective for one that has already left.
    """

    def __init__(self, final: str, path: str):
        self.final, self.path = final, path
        self._existed = False  # seen between steps: its disappearance later is a removal
        self.agreed_failure = False  # the ranks agreed that a step failed: rank 0 alone removes the copy

    def step(self, what: Optional[str], write: Callable[[], Any]) -> None:
        """Collective: run ``write()`` (the part of the copy this rank writes, e.g. the model) and agree."""
        with self.writing(what):
            write()

    @contextmanager
    def writing(self, what: Optional[str] = None) -> Iterator[None]:
        """Collective: the block writes ``what`` into ``path``; every rank leaves it the same way."""
        self._existed = self._existed or os.path.lexists(self.path)
        error = None
        try:
            with deferred_write_failures() as deferred:
                yield
            error = deferred.error
        except Exception as e:
            error = e
        self._agree(what, error)

    def _agree(self, what: str, error: Optional[BaseException]) -> None:
        rank, world = global_rank(), global_world_size()
        if world > 1:  # first, whether any rank failed: once this returns, every rank's step is over
            flags: List[Optional[bool]] = [None] * world
            dist.all_gather_object(flags, error is not None)
            any_failed = any(flags)
        else:
            any_failed = error is not None
        if not any_failed:
            self._existed = self._existed or os.path.lexists(self.path)
            return
        # Only now is the copy's state settled: a rank (or another process) removing the partial folder
        # may still have been at it when this rank's write into it failed.
        mine = None
        if error is not None:
            gone = not os.path.lexists(self.path) and (self._existed or world > 1)
            mine = (rank, what, *classify(error, gone))
        if world > 1:
            everyone: List[Optional[Tuple[int, str, str, str]]] = [None] * world
            dist.all_gather_object(everyone, mine)
            failed = [f for f in everyone if f is not None]
        else:
            failed = [mine]
        bad_rank, bad_what, kind, reason = min(failed, key=lambda f: (_PRIORITY.index(f[2]), f[0]))
        self.agreed_failure = True
        if kind == "error" and bad_rank == rank:
            raise error  # a defect, not the storage's: its own traceback
        if kind == "error":
            raise CheckpointError(f"writing {self.final!r} was abandoned on rank {rank}: rank {bad_rank} failed"
                                  f"{_part(bad_what, bad_rank, 1)} with {reason}; every complete copy is kept."
                                  ) from error
        part = _part(bad_what, bad_rank, world)
        if kind == "gone":
            text = (f"writing {self.final!r} was abandoned: {reason}{part}, by another process or a clean-up of its "
                    f"folder; every complete copy is kept.")
        else:
            text = (f"writing {self.final!r} failed: {reason}{part}; the partial copy was "
                    f"removed and an older {os.path.basename(self.final)!r}, if any, is kept. Free space, raise the "
                    f"quota or file-size limit, or write to another disk, then save again.")
        raise WriteFailed(text, self.final, bad_rank, bad_what, kind, reason) from error

    def _publish(self) -> None:
        """Rank 0 renames the complete copy to its final name; every rank learns how that went."""
        problem = None
        if global_rank() == 0:
            try:
                _replace(self.path, self.final)
            except (OSError, CheckpointError) as e:
                problem = (type(e) if isinstance(e, CheckpointError) else StorageError,
                           f"cannot publish {self.final!r}: {e}")
        problem = from_rank0(problem)
        if problem is not None:
            raise problem[0](problem[1])


def _replace(tmp: str, final_path: str) -> None:
    if not os.path.lexists(tmp):
        raise CheckpointError(f"nothing was written to {tmp}; cannot publish {final_path}")
    old = None
    if os.path.isdir(final_path) or (os.path.lexists(final_path) and os.path.isdir(tmp)):
        old = f"{final_path}{OLD_TAG}{tmp.rsplit(TMP_TAG, 1)[1].split('-', 1)[0]}"
        os.rename(final_path, old)
    os.replace(tmp, final_path)
    if old is not None:
        remove_path(old)


@contextmanager
def collective_write(final_path: str) -> Iterator[PartialCopy]:
    """Collective: yields the same :class:`PartialCopy` of ``final_path`` on every rank, whose
    ``path`` is a temporary sibling; when the block completes on every rank, rank 0 renames it to
    ``final_path`` (file or folder), replacing an older one, and every rank waits for the rename.

    Write through ``copy.step(what, write)``: a write that found no room (``storage_failure``) or
    whose partial folder disappeared ends the save on every rank with the same :class:`WriteFailed`
    (a :class:`StorageError`, exit code 2), after rank 0 removed the partial copy. A rank that
    stops otherwise (a second Ctrl-C, a killed peer) removes the partial copy itself; a peer that
    went away shows as the save abandoned (:class:`CheckpointError`) on the ranks left.

    A file replaces a file in one atomic ``os.replace``. A folder (which POSIX cannot replace
    atomically) that already exists is first renamed to ``<final>.old-<uid>``, the new one is moved
    in, and only then is the old copy deleted. A kill between the two renames leaves the complete
    old copy under ``*.old-*``, which ``catalog.list_checkpoints`` considers when the final name is
    missing, so there is never a moment without a complete object for this name.
    """
    problem = None
    if global_rank() == 0:  # rank 0 publishes, so rank 0 owns the temporary name
        uid = f"{uuid.uuid4().hex[:12]}-{owner_stamp()}"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(final_path)), exist_ok=True)
        except OSError as e:
            problem = f"cannot create the folder of {final_path!r}: {e.strerror or e}; nothing was written."
    uid, problem = from_rank0((uid, problem) if global_rank() == 0 else None)
    if problem is not None:
        raise StorageError(problem)
    copy = PartialCopy(final_path, f"{final_path}{TMP_TAG}{uid}")
    try:
        yield copy
    except BaseException as e:  # a failed or interrupted write: its partial object goes with it
        if not copy.agreed_failure or global_rank() == 0:  # agreed: rank 0 alone removes it
            _remove_quietly(copy.path)
        if isinstance(e, Exception) and not isinstance(e, (WriteFailed, CheckpointError)):
            if global_world_size() > 1 and peer_lost(e):  # the rank that failed says why (rank 0 prints it)
                raise CheckpointError(f"writing {final_path!r} was abandoned on rank {global_rank()}: another rank "
                                      f"stopped while it was written; every complete copy is kept.") from e
            reason = storage_failure(e)
            if reason is not None:
                raise StorageError(f"writing {final_path!r} failed: {reason}; the partial copy was removed and an "
                                   f"older {os.path.basename(final_path)!r}, if any, is kept. Free space, raise the "
                                   f"quota or file-size limit, or write to another disk, then save again.") from e
        raise
    copy._publish()


@contextmanager
def atomic_path(final_path: str) -> Iterator[str]:
    """Collective: :func:`collective_write` with the whole block as one write step; yields the
    temporary path to write (a file, or a folder the block creates)."""
    with collective_write(final_path) as copy:
        with copy.writing():
            yield copy.path


@contextmanager
def weights_only_loads() -> Iterator[None]:
    """Force ``torch.load(weights_only=True)`` in this block, including in library code we do not
    own (Colossal-AI's optimizer and scheduler loaders), whatever the environment says otherwise.

    torch reads ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` at every ``torch.load`` call and lets it override
    an explicit ``weights_only=False``; ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` must be unset meanwhile
    because torch refuses both at once.
    """
    saved = {k: os.environ.get(k) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load_torch_file(path: str, allowed: Sequence[type] = ()) -> Any:
    """``torch.load`` of tensors/containers (and the ``allowed`` classes) only, onto the CPU. A file
    that needs pickle for anything else is refused, as is a missing, unreadable or damaged one:
    a CheckpointError names the file and what to do."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is not a file" + (" (it is a folder)" if os.path.isdir(path) else
                                                           " (it does not exist)"))
    try:
        with weights_only_loads(), torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        raise CheckpointError(
            f"{path} holds pickled Python objects{f' ({found.group(1)})' if found else ''} besides tensors, and "
            f"loading it would run code from the file, so it is refused. Re-save it as tensors only, e.g. "
            f"torch.save(model.state_dict(), path) or safetensors, where you trust its source") from None
    except Exception as e:
        raise CheckpointError(f"cannot read {path} (truncated, or not a torch file?): {type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}") from None
