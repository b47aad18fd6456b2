"""Noise schedules: the betas of a discrete Gaussian diffusion, computed in float64.

* ``"linear"`` (DDPM, used by DiT): betas spaced evenly from 1e-4 to 2e-2 for 1000 steps. For another
  step count both ends are multiplied by ``1000 / num_steps`` so that the total amount of noise added
  (roughly the sum of the betas) stays about the same as with 1000 steps.
* ``"cosine"`` (Improved DDPM): defined through the cumulative signal level
  ``alpha_bar(s) = cos^2((s + 0.008) / 1.008 * pi / 2)`` for ``s`` in [0, 1]; each beta is the ratio of
  consecutive ``alpha_bar`` values, capped at 0.999 so the last steps do not become singular. The small
  offset 0.008 keeps the first betas from being vanishingly small. ``"squaredcos_cap_v2"`` is accepted as
  an alias because DiT configs (and diffusers) spell it that way.

Float64 matters: products of 1000 numbers close to 1 lose precision in float32, and the derived
tables (posterior coefficients, ``1 / sqrt(alpha_bar)`` near 156 at the last step) inherit the error.
"""

import math
from typing import Callable

import torch

_COSINE_NAMES = ("cosine", "squaredcos_cap_v2")
SCHEDULE_NAMES = ("linear",) + _COSINE_NAMES


def betas_for_alpha_bar(num_steps: int, alpha_bar: Callable[[float], float], max_beta: float = 0.999) -> torch.Tensor:
    """Betas [num_steps] such that the cumulative product of ``1 - beta`` follows ``alpha_bar``.

    ``alpha_bar`` maps continuous time in [0, 1] to the fraction of signal left; step ``i`` covers
    the time interval ``[i / n, (i + 1) / n]``. ``max_beta`` caps each beta below 1 to avoid a step
    that destroys all signal at once (``alpha_bar(1)`` is 0 for the cosine schedule).
    """
    betas = [
        min(1.0 - alpha_bar((i + 1) / num_steps) / alpha_bar(i / num_steps), max_beta) for i in range(num_steps)
    ]
    return torch.tensor(betas, dtype=torch.float64)


def _cosine_alpha_bar(s: float) -> float:
    return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2


def get_named_beta_schedule(name: str, num_steps: int) -> torch.Tensor:
    """Betas [num_steps] (float64) of the schedule called ``name``: "linear" or "cosine"."""
    if num_steps < 1:
        raise ValueError(f"a noise schedule needs at least one step, got num_steps={num_steps}")
    if name == "linear":
        scale = 1000 / num_steps  # keeps the total noise of DDPM's 1000-step schedule
        return torch.linspace(scale * 1e-4, scale * 2e-2, num_steps, dtype=torch.float64)
    if name in _COSINE_NAMES:
        return betas_for_alpha_bar(num_steps, _cosine_alpha_bar)
    raise ValueError(f"unknown noise schedule {name!r}; choose one of {', '.join(map(repr, SCHEDULE_NAMES))}")
