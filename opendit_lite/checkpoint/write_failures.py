"""What a failed write of a save means, and writes that fail without breaking a collective.

A write of a checkpoint fails for one of three kinds of reason, and each is reported differently:

- ``storage``: the disk or a quota is full, a file-size limit was hit, the file system is read-only
  (ENOSPC, EFBIG, EDQUOT, EROFS; also as safetensors and torch's zip writer word them);
- ``gone``: the partial copy's folder (or a folder above it) no longer exists, so the write found no
  parent (``No such file or directory``, torch.save's ``Parent directory ... does not exist``);
- ``error``: anything else, which is a defect and keeps its traceback.

Colossal-AI's ZeRO and Gemini checkpoint IO interleave the gathers of a sharded state (collectives
every rank joins) with the writes of its shards (rank 0): a rank whose shard write raised would
leave the loop while its peers wait in the next gather for it. Inside :func:`deferred_write_failures`
a storage or missing-folder failure of ``torch.save`` or safetensors' ``save_file`` (the two calls
every checkpoint IO writes tensors through) is recorded instead of raised, and the rank's later
writes in the block are skipped, so every rank finishes the block's collectives; the caller then
reads the recorded failure and all ranks agree on the outcome (``files.PartialCopy``).
"""

import errno
import os
import re
import threading
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

# Write failures that are the storage's, not the data's: the disk or a quota is full, a file-size
# limit was hit, the file system is read-only.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS)
# The same seen through libraries that do not raise OSError: safetensors ("... (os error 28)") and
# torch's zip writer, whose short write reports no errno ("unexpected pos", "file write failed", or
# its output stream's "basic_ios::clear: iostream error" when the end of the file cannot be written).
_STORAGE_TEXT = re.compile(r"os error (%s)\b|unexpected pos \d+ vs \d+|file write failed|failed writing|"
                           r"basic_ios::clear: iostream error"
                           % "|".join(str(n) for n in STORAGE_ERRNOS))
# How a write into a folder that is gone fails: OSError ENOENT, torch.save's "Parent directory ...
# does not exist", safetensors' "No such file or directory (os error 2)".
_MISSING_PATH = re.compile(r"No such file or directory|does not exist")


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or during."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def storage_failure(error: BaseException) -> Optional[str]:
    """Why ``error`` (or an exception it was raised from) is the storage's failure, in words; None
    when it is not one."""
    for e in _chain(error):
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return os.strerror(e.errno)
        match = _STORAGE_TEXT.search(str(e))
        if match:
            return (os.strerror(int(match.group(1))) if match.group(1)
                    else "a write came up short (a full disk or a file-size limit)")
    return None


def missing_folder(error: BaseException) -> bool:
    """Whether ``error`` is a write that found no folder to write into."""
    return any((isinstance(e, OSError) and e.errno == errno.ENOENT) or _MISSING_PATH.search(str(e)) is not None
               for e in _chain(error))


def classify(error: BaseException, copy_gone: bool) -> Tuple[str, str]:
    """``(kind, reason)`` of a failed write (kinds as in the module docstring); ``copy_gone`` says
    whether the partial copy it wrote into has disappeared."""
    reason = storage_failure(error)
    if reason is not None:
        return "storage", reason
    if copy_gone and missing_folder(error):
        return "gone", "its partial folder was removed while it was written"
    return "error", f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"


class DeferredFailure:
    """The first storage or missing-folder failure recorded inside :func:`deferred_write_failures`."""

    def __init__(self):
        self.error: Optional[BaseException] = None


_active = threading.local()


def _deferring(save, record: DeferredFailure):
    def wrapper(*args, **kwargs):
        if record.error is not None:  # the copy is lost already: skip the write, keep the collectives going
            return None
        try:
            return save(*args, **kwargs)
        except Exception as e:
            if storage_failure(e) is None and not missing_folder(e):
                raise
            record.error = e
            return None
    return wrapper


@contextmanager
def deferred_write_failures() -> Iterator[DeferredFailure]:
    """In this block (on this thread), ``torch.save`` and ``safetensors.torch.save_file`` record a
    storage or missing-folder failure in the yielded object instead of raising it, and skip every
    later write; other failures still raise. Nested blocks share the outer one's record."""
    outer = getattr(_active, "record", None)
    if outer is not None:
        yield outer
        return
    import safetensors.torch
    import torch

    record = DeferredFailure()
    originals = torch.save, safetensors.torch.save_file
    thread = threading.get_ident()

    def on_this_thread(save, deferring):
        # Another thread's writes (a logger's, a data worker's) keep their own behaviour.
        return lambda *a, **k: (deferring if threading.get_ident() == thread else save)(*a, **k)

    _active.record = record
    torch.save = on_this_thread(originals[0], _deferring(originals[0], record))
    safetensors.torch.save_file = on_this_thread(originals[1], _deferring(originals[1], record))
    try:
        yield record
    finally:
        torch.save, safetensors.torch.save_file = originals
        _active.record = None
