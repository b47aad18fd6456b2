"""Few-step distillation by distribution matching (DMD2, Yin et al. 2024) for rectified-flow models: the
losses of the student (a few-step generator) and of the critic (the "fake score": a denoiser of the
student's samples), given three velocity predictors ``(x, t) -> v`` that the caller builds (the frozen
teacher with guidance, the critic, the student; with LoRA, one base with two adapters).

Conventions are ``rectified_flow.RectifiedFlow``'s: ``x_t = (1 - t) x_0 + t noise``, ``v = noise - x_0``,
models called with ``t x num_timesteps``, so ``x_0 = x_t - t v`` at any time.

* **The student's times** are the grid of the sampler it will run, N + 1 points from 1 down to 0: the
  zoo's Euler sampler (``RectifiedFlow.sample`` with ``num_steps = N``: ``shift(1 - k / N)``,
  ``sampler_times``), or a diffusers pipeline's scheduler for N steps (its ``sigmas``, which for
  ``FlowMatchEulerDiscreteScheduler`` run from 1 to 1/1000 before the shift, ``scheduler_times``). The
  student is trained at exactly the times it samples at, and moves between them as that sampler does
  (Euler).
* **Its input at step k** comes from its own earlier steps (``backward_simulate``: DMD2's backward
  simulation, no gradient), so training sees what sampling sees; step k's prediction
  ``x_0 = x_tk - t_k v`` is the generated sample the losses judge.
* **The student's loss** (``generator_loss``) moves each generated sample along the difference of two
  denoisers' answers at a random noise level: the critic's (the distribution the student produces)
  minus the teacher's (the data's), normalised per sample by the mean distance to the teacher's answer.
  Its gradient with respect to the sample is that difference: ``0.5 ||x - sg(x - g)||^2``.
* **The critic's loss** (``critic_loss``) is the flow-matching loss on the student's samples, detached:
  the critic follows the student's distribution (DMD2 updates it several times per student update).
* **The optional GAN term** (DMD2's): a head on the critic's intermediate features tells noised real
  data from the student's noised samples (``discriminator_loss``, with the critic's); the student is
  pushed towards "real" (``generator_gan_loss``). Both non-saturating.
"""

from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F

from .likelihood import mean_flat
from .rectified_flow import RectifiedFlow

Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [B, ...], model time [B]) -> v [B, ...]


def sampler_times(objective: RectifiedFlow, steps: int) -> List[float]:
    """The zoo's Euler sampler's grid for ``steps`` steps, N + 1 times from 1 to 0 (the model is evaluated
    at the first N): ``shift(1 - k / steps)``, k = 0..steps."""
    if steps < 1:
        raise ValueError(f"a student takes at least 1 step, got {steps}")
    return [float(t) for t in objective.shift_time(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64))]


def scheduler_times(scheduler, steps: int, **set_timesteps) -> List[float]:
    """A diffusers flow-matching scheduler's grid for ``steps`` steps (its ``sigmas`` after
    ``set_timesteps(steps, **set_timesteps)``, N + 1 values ending at 0): the times a pipeline called with
    ``num_inference_steps=steps`` evaluates its transformer at."""
    scheduler.set_timesteps(steps, **set_timesteps)
    return [float(s) for s in scheduler.sigmas]


def backward_simulate(student: Velocity, noise: torch.Tensor, times: Sequence[float], k: int,
                      num_timesteps: int) -> torch.Tensor:
    """The student's input at its step ``k``: ``noise`` [B, ...] moved by its own Euler steps 0..k-1 (no
    gradient), as its sampler moves it; ``times``: the N + 1 grid (``sampler_times``, ``scheduler_times``)."""
    x = noise
    with torch.no_grad():
        for j in range(k):
            t = torch.full((x.shape[0],), times[j], device=x.device, dtype=torch.float32)
            x = x + (times[j + 1] - times[j]) * student(x, t * num_timesteps)
    return x


def predict_x0(velocity: Velocity, x: torch.Tensor, t: torch.Tensor, num_timesteps: int) -> torch.Tensor:
    """The clean sample a velocity predictor implies at (x [B, ...], t [B] in [0, 1]): ``x - t v``."""
    return x - t.view(-1, *([1] * (x.dim() - 1))) * velocity(x, t * num_timesteps)


def generator_loss(x0: torch.Tensor, teacher: Velocity, critic: Velocity, t: torch.Tensor, noise: torch.Tensor,
                   num_timesteps: int) -> torch.Tensor:
    """DMD's loss of generated samples x0 [B, ...] (with gradient to the student), judged at times t [B]
    with ``noise``: its gradient with respect to x0 is ``(x0_critic - x0_teacher) / (B * n * w)`` where
    ``w`` is each sample's mean |x0 - x0_teacher| (n elements per sample); ``teacher`` already guided."""
    s = t.view(-1, *([1] * (x0.dim() - 1)))
    with torch.no_grad():
        x_t = (1 - s) * x0 + s * noise
        real = predict_x0(teacher, x_t, t, num_timesteps)
        fake = predict_x0(critic, x_t, t, num_timesteps)
        weight = mean_flat((x0 - real).abs()).clamp(min=1e-8).view_as(s)        # [B, 1, ...]
        gradient = (fake - real) / weight
        target = x0 - gradient
    return 0.5 * ((x0 - target) ** 2).mean()


def critic_loss(x0: torch.Tensor, critic: Velocity, t: torch.Tensor, noise: torch.Tensor,
                num_timesteps: int) -> torch.Tensor:
    """The critic's flow-matching loss on the student's samples x0 [B, ...] (detached here)."""
    x0 = x0.detach()
    s = t.view(-1, *([1] * (x0.dim() - 1)))
    x_t = (1 - s) * x0 + s * noise
    return ((critic(x_t, t * num_timesteps) - (noise - x0)) ** 2).mean()


def judge_times(batch: int, generator: Optional[torch.Generator], device, low: float = 0.02,
                high: float = 0.98) -> torch.Tensor:
    """The noise levels [B] the losses judge samples at: uniform in [low, high] (DMD2 leaves out the two
    ends, where both denoisers agree or see nothing)."""
    u = torch.rand(batch, generator=generator, device=device if generator is None else generator.device)
    return (low + (high - low) * u).to(device)


def discriminator_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """DMD2's GAN term for the critic's head (non-saturating): logits [B] of noised real data towards
    "real", of the student's noised samples towards "fake"."""
    return F.softplus(-real_logits).mean() + F.softplus(fake_logits).mean()


def generator_gan_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    """DMD2's GAN term for the student (non-saturating): its noised samples' logits [B] towards "real"."""
    return F.softplus(-fake_logits).mean()
