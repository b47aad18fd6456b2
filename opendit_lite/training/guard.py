"""Non-finite guard: a NaN/inf loss stops the run (exit code 3) before any checkpoint is written
after it, or, with ``nan_policy=skip_step``, drops that step's update and goes on.

``stop`` costs nothing per step: each step's loss is tested on the device and the first bad step
is recorded there; the flag rides on the loop's log-point all-reduce, and a save first checks the
record and the weights (one host sync, where the save syncs anyway). ``skip_step`` needs to know
before ``optimizer.step()``, so it costs one small all-reduce and host sync per step.
"""

import torch
import torch.distributed as dist

from ..checkpoint.save_restore import all_finite
from ..errors import NonFiniteError

MAX_CONSECUTIVE_SKIPS = 10  # skip_step gives up when the weights themselves have gone bad


class NonFiniteGuard:
    def __init__(self, device, policy: str = "stop"):
        if policy not in ("stop", "skip_step"):
            raise ValueError(f"nan_policy must be 'stop' or 'skip_step', got {policy!r}")
        self.policy = policy
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)  # first step with a bad loss, -1: none
        self.skipped = 0
        self._consecutive = 0

    # ---------------------------------------------------------------- stop (no per-step sync)

    def observe(self, step: int, loss: torch.Tensor) -> None:
        """Record ``step`` if ``loss`` is not finite and no earlier step was (device ops only)."""
        bad = ~torch.isfinite(loss.detach())
        self.first_bad = torch.where(bad & (self.first_bad < 0), torch.full_like(self.first_bad, step), self.first_bad)

    def flag_like(self, like: torch.Tensor) -> torch.Tensor:
        """1.0 when this rank saw a bad loss: summed in the loop's log-point all-reduce."""
        return (self.first_bad >= 0).to(like.dtype)

    def raise_if_flagged(self, flag_sum: float) -> None:
        """After the log-point all-reduce: stop naming the first bad step over all ranks."""
        if flag_sum > 0:
            self._raise(self._first_bad_step(), "the loss")

    def check_before_save(self, step: int, model) -> None:
        """Collective: raise before a checkpoint at ``step`` would store non-finite state."""
        flag = self.flag_like(torch.zeros((), device=self.first_bad.device))
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag)
        if flag.item() > 0:
            self._raise(self._first_bad_step(), "the loss")
        if not all_finite(model):
            self._raise(step, "the weights")

    def _first_bad_step(self) -> int:
        step = torch.where(self.first_bad >= 0, self.first_bad, torch.full_like(self.first_bad, 2 ** 62))
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(step, op=dist.ReduceOp.MIN)
        return int(step.item())

    @staticmethod
    def _raise(step: int, what: str) -> None:
        raise NonFiniteError(
            f"{what} became NaN or infinite at step {step}, so the run stopped without writing or pruning any "
            f"checkpoint after it. Lower lr, keep grad_clip > 0, check the data for NaN values, or use "
            f"precision=fp32; then resume with auto_resume=true from the last checkpoint (all are finite)."
        )

    # ---------------------------------------------------------------- skip_step (one sync per step)

    def should_skip(self, step: int, loss: torch.Tensor) -> bool:
        """skip_step only: whether any rank's loss of this step is not finite (a collective)."""
        bad = (~torch.isfinite(loss.detach())).float()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(bad)
        if bad.item() == 0:
            self._consecutive = 0
            return False
        self.skipped += 1
        self._consecutive += 1
        if self._consecutive > MAX_CONSECUTIVE_SKIPS:
            self._raise(step, f"the loss of {MAX_CONSECUTIVE_SKIPS + 1} consecutive batches")
        return True
