"""A few-step student sampled by a diffusers pipeline's own scheduler: the grid and the moves of the
pipeline called with ``num_inference_steps = N`` (no classifier-free guidance), for distilling a
released pipeline (``training/distill_pipeline.py``).

Training the student at the pipeline's times is not enough for the pipeline to reproduce it: the
scheduler also decides how the latents move between those times (Euler for
``FlowMatchEulerDiscreteScheduler``; Wan's UniPC is a multistep predictor-corrector on integer
timesteps). So the student's input at its step k (DMD2's backward simulation) is made by the scheduler
itself, a fresh copy set up as the pipeline sets it up, stepping the student's own predictions: the
pipeline's loop with the student in it. A sample of the student is then the pipeline's output for the
same noise (tested against the pipeline), whatever the solver.

Flow matching only (``x_t = (1 - s) x_0 + s noise``, the model predicts ``v = noise - x_0``, so
``x_0 = x_t - s v`` at the scheduler's sigma s): ``FlowMatchEulerDiscreteScheduler``, or a multistep
scheduler on flow sigmas predicting the flow (``use_flow_sigmas``, ``prediction_type="flow_prediction"``:
UniPC, DPM-Solver++).
"""

import copy
from typing import Callable, Optional, Sequence

import torch

# (x [B, ...], the pipeline's timestep [B]) -> the velocity v [B, ...]
Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def flow_scheduler_error(scheduler) -> Optional[str]:
    """Why ``scheduler`` cannot sample a flow-matching student (None: it can)."""
    name, config = type(scheduler).__name__, scheduler.config
    if name == "FlowMatchEulerDiscreteScheduler":
        if config.get("stochastic_sampling"):
            return f"{name} with stochastic_sampling=true re-noises each step"
        if any(config.get(k) for k in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")):
            return f"{name} with karras / exponential / beta sigmas"
        return None
    if config.get("use_flow_sigmas") and config.get("prediction_type") == "flow_prediction":
        return None
    return (f"{name} (prediction_type={config.get('prediction_type')!r}, use_flow_sigmas="
            f"{config.get('use_flow_sigmas')!r}) is not a flow-matching scheduler")


class SchedulerRollout:
    """The pipeline's scheduler set up for ``steps`` steps (``set_timesteps(steps, **set_timesteps)``, as
    the pipeline's ``__call__`` calls it): ``timesteps`` [N] (what the transformer is given), ``sigmas``
    [N + 1] (the noise levels, ending at 0)."""

    def __init__(self, scheduler, steps: int, **set_timesteps):
        self.scheduler, self.steps, self.set_timesteps = scheduler, steps, set_timesteps
        fresh = self._fresh(torch.device("cpu"))
        self.timesteps = fresh.timesteps.clone()                                 # [N]
        self.sigmas = fresh.sigmas.clone()                                       # [N + 1]

    def _fresh(self, device):
        scheduler = copy.deepcopy(self.scheduler)
        scheduler.set_timesteps(self.steps, device=device, **self.set_timesteps)
        return scheduler

    def problem(self) -> Optional[str]:
        """Why this grid is not one a student can be trained on (None: it is): N distinct timesteps and
        N + 1 decreasing noise levels from (about) 1 to 0."""
        t, s = self.timesteps, self.sigmas.double()
        if len(t) != self.steps or len(s) != self.steps + 1:
            return f"it gives {len(t)} timesteps for num_inference_steps={self.steps}"
        distinct = len(set(t.tolist()))
        if distinct != len(t) or not bool((s[1:] < s[:-1]).all()):
            return (f"only {distinct} of its {len(t)} timesteps for {self.steps} steps differ (the grid is finer than "
                    f"the timesteps it gives the transformer), so the student's steps would repeat")
        if float(s[-1]) != 0.0:
            return f"its last noise level is {float(s[-1]):.4g}, not 0: the pipeline's sample would keep noise"
        return None

    def times(self) -> Sequence[float]:
        """The N + 1 noise levels as floats (``distribution_matching.scheduler_times``' grid)."""
        return [float(v) for v in self.sigmas]

    @torch.no_grad()
    def rollout(self, student: Velocity, noise: torch.Tensor, k: int) -> torch.Tensor:
        """The student's input at its step ``k`` (0..N): ``noise`` [B, ...] moved by the scheduler through
        the student's steps 0..k-1, as the pipeline moves its latents (k = N: the student's sample)."""
        scheduler, x = self._fresh(noise.device), noise
        for j in range(k):
            t = scheduler.timesteps[j]
            x = scheduler.step(student(x, t.expand(x.shape[0])), t, x, return_dict=False)[0]
        return x

    def timestep(self, k: int, batch: int, device) -> torch.Tensor:
        """The transformer's timestep [B] at step k (the scheduler's value)."""
        return self.timesteps[k].to(device).expand(batch)

    def predict_x0(self, student: Velocity, x: torch.Tensor, k: int) -> torch.Tensor:
        """The clean sample the student predicts at step k from its input x [B, ...]: ``x - sigma_k v``."""
        v = student(x, self.timestep(k, x.shape[0], x.device))
        return x - self.sigmas[k].to(device=x.device, dtype=x.dtype) * v
