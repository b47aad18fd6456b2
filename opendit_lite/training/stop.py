"""Stop a run cleanly on Ctrl-C or SIGTERM (a scheduler's pre-emption): the first signal asks the
loop to stop at its next log point, where every rank agrees on it and a checkpoint is saved, so no
work since the last checkpoint is lost. A second signal stops at once."""

import signal
from typing import Optional

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Context manager installing the handlers; ``agreed(device)`` is a collective that is true when
    any rank got a signal (call it where the loop syncs anyway: it costs one tiny all-reduce)."""

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

    def agreed(self, device: Optional[torch.device] = None) -> bool:
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
