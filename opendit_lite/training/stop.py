"""Stop a run cleanly on Ctrl-C or SIGTERM (a scheduler's pre-emption): the first signal asks the
loop to stop at its next log point, where every rank agrees on it and a checkpoint is saved, so no
work since the last checkpoint is lost. A second signal stops at once."""

import signal

import torch

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Context manager installing the handlers; ``flag_like`` is this rank's vote, reduced with the
    loop's own all-reduce so that every rank stops at the same step."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:  # second signal: give up waiting for the log point
            self._restore()
            raise KeyboardInterrupt
        self.requested = True

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

    def __exit__(self, *exc) -> None:
        self._restore()

    def flag_like(self, like: torch.Tensor) -> torch.Tensor:
        """1.0 when this rank got a signal, else 0.0, as a tensor like ``like``: sum it over the ranks
        in the collective the loop makes anyway, and stop when the sum is positive."""
        return torch.full_like(like, 1.0 if self.requested else 0.0)
