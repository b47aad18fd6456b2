"""Atomic publication of files and folders, and loading that never unpickles arbitrary objects.

A checkpoint (or a LiteGen ``save_*`` file) is written under ``<name>.tmp-<uid>-<pid>@<host>`` (rank
0's process id and host: ``litter.py`` removes the ones whose owner died) and renamed to its final
name by rank 0 once every rank has written its part, so a process killed midway leaves only the
``*.tmp-*`` name, which no reader takes for a checkpoint. Torch files are read with
``weights_only`` forced on, also inside library loaders we do not own (Colossal-AI's).
"""

import errno
import os
import pickle
import re
import shutil
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

import torch

from ..distributed.ranks import barrier, from_rank0, global_rank, global_world_size
from ..errors import CheckpointError, StorageError
from ..utils.processes import owner_stamp

TMP_TAG = ".tmp-"
OLD_TAG = ".old-"  # a complete checkpoint moved aside while a re-save of its step is published


# Write failures that are the storage's, not the data's: the disk or a quota is full, a file-size
# limit was hit, the file system is read-only.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS)
# The same seen through libraries that do not raise OSError: safetensors ("... (os error 28)") and
# torch's zip writer, whose short write reports no errno ("unexpected pos", "file write failed").
_STORAGE_TEXT = re.compile(r"os error (%s)\b|unexpected pos \d+ vs \d+|file write failed|failed writing"
                           % "|".join(str(n) for n in STORAGE_ERRNOS))


def storage_failure(error: BaseException) -> Optional[str]:
    """Why ``error`` (or an exception it was raised from) is the storage's failure, in words; None
    when it is not one."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            return os.strerror(error.errno)
        match = _STORAGE_TEXT.search(str(error))
        if match:
            return (os.strerror(int(match.group(1))) if match.group(1)
                    else "a write came up short (a full disk or a file-size limit)")
        error = error.__cause__ or error.__context__
    return None


# how a write into a folder that is gone fails: OSError ENOENT, torch.save's "Parent directory ... does
# not exist", safetensors' "No such file or directory"
_MISSING_PATH = re.compile(r"No such file or directory|does not exist")


def remove_path(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _remove_quietly(path: str) -> None:
    try:
        remove_path(path)
    except OSError:
        pass


@contextmanager
def atomic_path(final_path: str) -> Iterator[str]:
    """Collective: yields the same temporary sibling of ``final_path`` on every rank; when the block
    has completed on every rank, rank 0 renames it to ``final_path`` (file or folder), replacing an
    older one, and every rank waits for the rename. When the block raises (a full disk, a second
    Ctrl-C), the rank that raised removes the temporary object before passing the error on; a write
    that found no room (``storage_failure``) becomes a :class:`StorageError` naming ``final_path``.

    A file replaces a file in one atomic ``os.replace``. A folder (which POSIX cannot replace
    atomically) that already exists is first renamed to ``<final>.old-<uid>``, the new one is moved
    in, and only then is the old copy deleted. A kill between the two renames leaves the complete
    old copy under ``*.old-*``, which ``catalog.list_checkpoints`` considers when the final name is
    missing, so there is never a moment without a complete object for this name.
    """
    uid = from_rank0(f"{uuid.uuid4().hex[:12]}-{owner_stamp()}")  # rank 0 publishes, so rank 0 owns it
    tmp = f"{final_path}{TMP_TAG}{uid}"
    if global_rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(final_path)), exist_ok=True)
    barrier()
    try:
        yield tmp
    except BaseException as e:  # a failed or interrupted write: its partial object goes with it
        # Another rank whose write failed has already removed the shared temporary folder: this
        # rank's write then fails on a missing path, which says nothing about this rank's storage.
        abandoned = (global_world_size() > 1 and isinstance(e, Exception) and not os.path.lexists(tmp)
                     and _MISSING_PATH.search(str(e)) is not None)
        _remove_quietly(tmp)
        if abandoned:
            raise CheckpointError(f"writing {final_path!r} was abandoned on rank {global_rank()}: another rank "
                                  f"failed and removed the partial copy; every complete copy is kept.") from e
        reason = storage_failure(e) if isinstance(e, Exception) else None
        if reason is not None:
            raise StorageError(f"writing {final_path!r} failed: {reason}; the partial copy was removed and an "
                               f"older {os.path.basename(final_path)!r}, if any, is kept. Free space, raise the quota "
                               f"or file-size limit, or write to another disk, then save again.") from e
        raise
    barrier()
    if global_rank() == 0:
        if not os.path.lexists(tmp):
            raise CheckpointError(f"nothing was written to {tmp}; cannot publish {final_path}")
        old = None
        if os.path.isdir(final_path) or (os.path.lexists(final_path) and os.path.isdir(tmp)):
            old = f"{final_path}{OLD_TAG}{uid.split('-', 1)[0]}"
            os.rename(final_path, old)
        os.replace(tmp, final_path)
        if old is not None:
            remove_path(old)
    barrier()


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
