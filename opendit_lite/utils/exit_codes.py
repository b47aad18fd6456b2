"""How the scripts end: one paragraph and a documented exit code, never a traceback for a user's
mistake. The errors and their codes are listed in ``opendit_lite.errors``.

Under torchrun every rank raises the same error; only global rank 0 prints it, and every rank writes
it to torch elastic's error file (``TORCHELASTIC_ERROR_FILE``), so torchrun's failure summary shows
the paragraph and the exit code instead of a pointer to its traceback docs. ``--debug`` on the
command line (or ``OPENDIT_DEBUG=1`` in the environment) shows the traceback as well.
"""

import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable, Iterator, Optional, Sequence

from ..errors import EXIT_INTERRUPTED, EXIT_NON_FINITE, USER_ERRORS, CheckpointError, NonFiniteError, RunInterrupted  # noqa: F401  (their former home; raised by the trainers)

DEBUG_FLAG, DEBUG_ENV = "--debug", "OPENDIT_DEBUG"
ELASTIC_EXIT_DELAY_S = 2.0
ELASTIC_PEER_WAIT_S = 5.0


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _paragraph(error: BaseException) -> str:
    if isinstance(error, KeyboardInterrupt):
        return "interrupted before a checkpoint was written; rerun with auto_resume=true to continue from the last one."
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, CheckpointError):
        text += "" if text.endswith((".", "?", "!")) else "."
        text += (" Point resume_from/init_from/sample.ckpt at a complete checkpoint folder, or use auto_resume=true "
                 "to take the newest one that verifies.")
    return text


def write_elastic_error(text: str) -> None:
    """Hand ``text`` to torchrun's failure summary through the error file torch elastic gives each
    worker (``TORCHELASTIC_ERROR_FILE``), in the layout of torch's ``@record``: the summary prints the
    ``py_callstack`` entry, which here is the paragraph. Outside torchrun nothing happens."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": text, "extraInfo": {"py_callstack": text,
                                                                  "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass  # the summary then falls back to torchrun's own pointer; the paragraph was printed anyway
    if not _is_rank0():
        # Every rank fails alike; torchrun stops the others at the first exit, so give rank 0 a moment
        # to print the paragraph before this rank's exit ends the run.
        time.sleep(ELASTIC_EXIT_DELAY_S)
    else:
        _wait_for_local_peers(path)


def _wait_for_local_peers(path: str) -> None:
    """Rank 0, before it exits: wait (at most ELASTIC_PEER_WAIT_S) until the other ranks of this node
    have written their error files too. A config error ends a rank in a fraction of a second, and
    torchrun stops the other ranks at the first exit: a rank still starting up would be stopped
    before it could write its file, and the summary would show torchrun's pointer to its docs for
    it. The files sit side by side as ``<attempt folder>/<local rank>/error.json`` (torch's layout);
    any other layout is not waited for."""
    local_rank, local_world = os.environ.get("LOCAL_RANK", "0"), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    folder = os.path.dirname(path)
    if local_world <= 1 or os.path.basename(folder) != local_rank:
        return
    peers = [os.path.join(os.path.dirname(folder), str(r), os.path.basename(path)) for r in range(local_world)
             if str(r) != local_rank]
    deadline = time.monotonic() + ELASTIC_PEER_WAIT_S
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in peers):
        time.sleep(0.05)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _exit_at_once(signum, frame) -> None:
    if _is_rank0():
        os.write(2, b"stopped: interrupted; nothing further was written.\n")
    os._exit(EXIT_INTERRUPTED)


def exit_at_once_on_stop_signals() -> None:
    """Call first in a script run as a program, before its slow imports: a Ctrl-C or SIGTERM before
    ``script_main`` runs ends the process at once with exit code 130 and one line, no traceback.
    Nothing has been written yet, and an exception raised in the middle of a library's import could
    be swallowed or leave it half-imported, hence ``os._exit``."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_at_once)


@contextlib.contextmanager
def heavy_imports() -> Iterator[None]:
    """Around the imports a script makes once its settings are checked (torch, Colossal-AI, timm:
    seconds): a Ctrl-C or SIGTERM meanwhile ends the process as :func:`exit_at_once_on_stop_signals`
    says; the handlers before the block are put back after it."""
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _exit_at_once) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def script_main(fn: Callable[[Sequence[str]], object]) -> Callable[[Optional[Sequence[str]]], object]:
    """Decorator for a script's ``main(argv)``: strips ``--debug``, runs it, and turns the errors of
    ``USER_ERRORS`` into one paragraph on stderr (rank 0 only) and their exit code."""

    @functools.wraps(fn)
    def wrapper(argv: Optional[Sequence[str]] = None):
        argv = list(sys.argv[1:] if argv is None else argv)
        debug = DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
        argv = [a for a in argv if a != DEBUG_FLAG]
        # SIGTERM (a scheduler's stop) acts as Ctrl-C does: at start-up the run ends with exit code 130,
        # leaving no partial file; the training loop turns either into a checkpoint first.
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)} \
            if _main_thread() else {}
        try:
            return fn(argv)
        except tuple(cls for cls, _ in USER_ERRORS) as e:
            code = next(c for cls, c in USER_ERRORS if isinstance(e, cls))
            label = "stopped" if code in (EXIT_NON_FINITE, EXIT_INTERRUPTED) else "error"
            if _is_rank0():
                if debug:
                    traceback.print_exc()
                print(f"{label}: {_paragraph(e)}", file=sys.stderr, flush=True)
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                ignore_stop_signals()
            write_elastic_error(f"{label} (exit code {code}): {_paragraph(e)}")
            sys.exit(code)
        finally:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:  # ignored: a stop honoured, keep it so
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return wrapper


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def ignore_stop_signals() -> None:
    """This process is ending (a stop honoured, or an error on its way to the exit code): Ctrl-C and
    SIGTERM are ignored from now on, so that torchrun stopping the ranks still exiting once one has
    ended, or a repeated stop, cannot cut a save short or turn the exit code into a kill by signal."""
    if _main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
