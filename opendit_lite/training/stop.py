"""Stop a run cleanly on Ctrl-C or SIGTERM (a scheduler's pre-emption): the first signal asks the
loop to stop at the next step boundary where every rank agrees on it (a single process: the next
step; several ranks: within ``CHECK_EVERY`` steps, or the next log point if sooner), and a
checkpoint is saved, so no work since the last checkpoint is lost. A second signal while waiting for
that step stops at once, unless it comes within ``REPEAT_WINDOW_S`` of the first: a launcher
(torchrun) that forwards the stop it got itself, or a scheduler that signals every process of the
job, must not cost the save. Once the ranks agreed, signals are ignored until the process exits."""

import signal
import time

import torch
import torch.distributed as dist

from ..utils.exit_codes import ignore_stop_signals

SIGNALS = (signal.SIGINT, signal.SIGTERM)
CHECK_EVERY = 5  # steps between the ranks' flag all-reduces (one tiny collective and host sync each)
REPEAT_WINDOW_S = 3.0  # a second signal sooner than this after the first is the same stop


class StopRequest:
    """Context manager installing the handlers; ``flag_like`` is this rank's vote, reduced with the
    loop's own all-reduce so that every rank stops at the same step."""

    def __init__(self):
        self.requested = False
        self._first_at = 0.0
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            if time.monotonic() - self._first_at < REPEAT_WINDOW_S:
                return  # the same stop, delivered twice
            self._restore()  # a second stop: give up waiting for the step boundary
            raise KeyboardInterrupt
        self.requested = True
        self._first_at = time.monotonic()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self) -> "StopRequest":
        try:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        except ValueError:  # not the main thread: signals cannot be handled here
            self._previous = {}
        return self

    def honour(self) -> None:
        """The ranks agreed to stop: the checkpoint is written and the process ends with exit code 130;
        from now on a repeat (torchrun stopping the ranks still exiting once one has ended) is ignored."""
        self._previous = {}
        ignore_stop_signals()

    def __exit__(self, *exc) -> None:
        self._restore()

    def flag_like(self, like: torch.Tensor) -> torch.Tensor:
        """1.0 when this rank got a signal, else 0.0, as a tensor like ``like``: sum it over the ranks
        in the collective the loop makes anyway, and stop when the sum is positive."""
        return torch.full_like(like, 1.0 if self.requested else 0.0)

    def agreed(self, step: int, like: torch.Tensor) -> bool:
        """Whether the ranks agree to stop after ``step``: this rank's flag alone in a world of one,
        else every ``CHECK_EVERY`` steps a sum over the ranks (collective: call it on every rank)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.requested
        if step % CHECK_EVERY:
            return False
        flag = self.flag_like(like)
        dist.all_reduce(flag)
        return flag.item() > 0
