"""Learning-rate schedules: linear warm-up, then constant, linear or cosine decay.

The factor the base LR is multiplied by at optimizer step s (0-based; W warm-up steps, T total
steps, m = ``min_lr_ratio``)::

    s < W:        (s + 1) / W                                  warm-up (reaches 1 at s = W - 1)
    constant:     1                                            DiT's recipe
    linear:       m + (1 - m) (1 - p)                          p = (s - W) / (T - W), clamped to [0, 1]
    cosine:       m + (1 - m) (1 + cos(pi p)) / 2

so the decays start at the full LR right after warm-up and end at ``min_lr_ratio x lr`` at the last
step. The schedule is a ``LambdaLR`` whose only state is the step count, saved with every
checkpoint: a resumed run continues the curve where it stopped (the curve's shape is taken from
the config, so changing ``max_steps`` on resume stretches the rest of the decay).
"""

import math
from typing import Callable, Dict

import torch

from ..config.schema import LR_SCHEDULES

# Schedule name -> the multiplier after warm-up at decay progress p in [0, 1], with m = min_lr_ratio.
# The config offers the names (``LR_SCHEDULES``); tests/training/test_lr_schedule.py checks both agree.
SCHEDULE_SHAPES: Dict[str, Callable[[float, float], float]] = {
    "constant": lambda p, m: 1.0,
    "linear": lambda p, m: m + (1.0 - m) * (1.0 - p),
    "cosine": lambda p, m: m + (1.0 - m) * (0.5 * (1.0 + math.cos(math.pi * p))),
}


def lr_factor(schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    """The multiplier of the base LR as a function of the 0-based optimizer step (formulas above)."""
    if schedule not in SCHEDULE_SHAPES:
        raise ValueError(f"lr_schedule={schedule!r}: choose one of {', '.join(LR_SCHEDULES)}")
    shape = SCHEDULE_SHAPES[schedule]
    decay_steps = max(1, total_steps - warmup_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return shape(min(1.0, (step - warmup_steps) / decay_steps), min_lr_ratio)

    return factor


def build_lr_scheduler(optimizer: torch.optim.Optimizer, *, schedule: str, warmup_steps: int, total_steps: int,
                       min_lr_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over ``optimizer`` following ``lr_factor``; call ``step()`` after each optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_factor(schedule, warmup_steps, total_steps, min_lr_ratio))
