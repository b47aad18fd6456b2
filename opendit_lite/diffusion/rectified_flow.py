"""Rectified flow (flow matching on straight paths) with an Euler sampler.

Convention (the one of Stable Diffusion 3 and diffusers' ``FlowMatchEulerDiscreteScheduler``):

* time ``t`` in [0, 1], **t = 0 is data and t = 1 is noise**:
  ``x_t = (1 - t) * x_0 + t * noise``;
* the model predicts the velocity ``v = dx_t/dt = noise - x_0`` (constant along each path), trained
  with the MSE to that target;
* sampling integrates ``dx/dt = v`` from t = 1 down to t = 0 with Euler steps
  ``x <- x + (t_next - t) * v``, i.e. it moves *against* the predicted velocity.
* the model is called with ``t * num_timesteps``, so a DiT-style timestep embedder sees the range
  it sees for a discrete diffusion (training times lie in [0, num_timesteps); the sampler's first
  call is at exactly ``num_timesteps``).

Some code bases (Open-Sora's RFlow) train on ``x_0 - noise`` instead; a model trained that way gives
the velocity with the opposite sign here.

``shift`` (SD3's resolution-dependent shift) maps ``t -> shift * t / (1 + (shift - 1) * t)``: above 1
it moves both the training times and the sampling grid towards the noise end, which larger images
and videos need because they keep recognisable structure at higher noise levels.
"""

import math
from typing import Callable, Dict, Optional, Sequence

import torch

from .guidance import cfg_model_fn
from .likelihood import mean_flat
from .registry import register_scheduler
from .sampling_utils import Device, initial_noise, progress_bar, resolve_device, standard_normal, standard_uniform

SAMPLE_METHODS = ("uniform", "logit-normal")


def resolution_shift(tokens: int, base_tokens: int, max_tokens: int, base_shift: float, max_shift: float) -> float:
    """The time shift for a sequence of ``tokens`` image or video tokens, as Flux and LTX-Video set it:
    ``exp(mu)`` with ``mu`` linear in the token count, ``base_shift`` at ``base_tokens`` and
    ``max_shift`` at ``max_tokens`` (extrapolated outside), so longer sequences train and sample
    nearer the noise end."""
    mu = base_shift + (max_shift - base_shift) * (tokens - base_tokens) / (max_tokens - base_tokens)
    return math.exp(mu)


@register_scheduler("rflow")
class RectifiedFlow:
    """Rectified-flow training loss and Euler sampler.

    Args:
        num_timesteps: scale of the time passed to the model (``t * num_timesteps``).
        sample_method: training-time distribution: "uniform" on [0, 1), or "logit-normal",
            ``sigmoid(N(logit_mean, logit_std^2))``, which SD3 found better as it trains more on the
            middle times where predicting the velocity is hardest.
        shift: time shift applied to training times and to the sampling grid (1 = none).
        logit_mean, logit_std: parameters of the logit-normal distribution.
        time_range: (lo, hi): training times are drawn from the distribution above (shift included)
            conditioned on ``lo <= t < hi``; one expert of a pair that splits the noise range (Wan
            2.2's) trains on its own range only. (0, 1): unconditioned, the plain draw.
    """

    def __init__(
        self,
        num_timesteps: int = 1000,
        sample_method: str = "uniform",
        shift: float = 1.0,
        logit_mean: float = 0.0,
        logit_std: float = 1.0,
        time_range: Sequence[float] = (0.0, 1.0),
    ):
        if sample_method not in SAMPLE_METHODS:
            raise ValueError(f"unknown sample_method {sample_method!r}; choose one of {', '.join(SAMPLE_METHODS)}")
        if shift <= 0:
            raise ValueError(f"shift must be positive (1 means no shift), got {shift}")
        if num_timesteps <= 0:
            raise ValueError(f"num_timesteps must be positive, got {num_timesteps}")
        self.num_timesteps = num_timesteps
        self.sample_method = sample_method
        self.shift = shift
        self.logit_mean = logit_mean
        self.logit_std = logit_std
        lo, hi = (float(v) for v in time_range)
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"time_range must satisfy 0 <= lo < hi <= 1, got {tuple(time_range)}")
        self.time_range = (lo, hi)

    def shift_time(self, t: torch.Tensor) -> torch.Tensor:
        """``shift * t / (1 + (shift - 1) * t)``: keeps 0 and 1 fixed, bends the times in between."""
        return self.shift * t / (1 + (self.shift - 1) * t)

    def sample_time(
        self, batch_size: int, device: Device = None, generator: Optional[torch.Generator] = None
    ) -> torch.Tensor:
        """Training times [batch_size] in [0, 1] drawn by ``sample_method`` and then shifted.
        ``generator`` may be a ``SampleGenerators`` (one time per sample from its own stream)."""
        if self.time_range != (0.0, 1.0):
            return self._sample_time_in_range(batch_size, device, generator)
        if self.sample_method == "uniform":
            t = standard_uniform((batch_size,), generator, device, torch.float32)
        else:
            normal = standard_normal((batch_size,), generator, device, torch.float32)
            t = torch.sigmoid(self.logit_mean + self.logit_std * normal)
        return self.shift_time(t)

    def unshift_time(self, t: torch.Tensor) -> torch.Tensor:
        """The inverse of ``shift_time``: ``t / (shift - (shift - 1) * t)``."""
        return t / (self.shift - (self.shift - 1) * t)

    def _sample_time_in_range(self, batch_size: int, device: Device, generator) -> torch.Tensor:
        """``sample_time`` conditioned on ``time_range``, by inverting the distribution's CDF: a
        uniform draw mapped into the CDF values of the range's ends (before the shift, which is
        monotone), then back through the inverse CDF and the shift."""
        u = standard_uniform((batch_size,), generator, device, torch.float64)                # [B] in [0, 1)
        lo, hi = self.unshift_time(torch.tensor(self.time_range, dtype=torch.float64, device=u.device))
        if self.sample_method == "uniform":  # CDF: the identity
            t = lo + (hi - lo) * u
        else:  # CDF of sigmoid(m + s N): Phi((logit(t) - m) / s)
            a, b = torch.special.ndtr((torch.logit(torch.stack([lo, hi])) - self.logit_mean) / self.logit_std)
            normal = torch.special.ndtri(a + (b - a) * u)
            t = torch.sigmoid(self.logit_mean + self.logit_std * normal)
        return self.shift_time(t).clamp(*self.time_range).float()                            # [B]

    def add_noise(self, x_start: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``x_t = (1 - t) x_0 + t noise`` for x_start, noise [B, ...] and t [B] in [0, 1]."""
        t = t.view(-1, *([1] * (x_start.dim() - 1))).to(x_start.dtype)
        return (1 - t) * x_start + t * noise

    def training_losses(
        self,
        model: Callable[..., torch.Tensor],
        x_start: torch.Tensor,
        model_kwargs: Optional[dict] = None,
        noise: Optional[torch.Tensor] = None,
        t: Optional[torch.Tensor] = None,
        loss_mask: Optional[torch.Tensor] = None,
    ) -> Dict[str, torch.Tensor]:
        """``{"loss": [B]}``: the per-sample MSE between the predicted and the true velocity.

        ``t`` [B] in [0, 1] defaults to ``sample_time``; ``noise`` defaults to a standard normal. Only
        the first C output channels are read, so a model with a learned-sigma block trains unchanged.
        ``loss_mask`` (0/1, broadcastable to x_start): the elements the mean is taken over (the latents
        a pipeline denoises, not those it keeps as given).
        """
        if noise is None:
            noise = torch.randn_like(x_start)
        elif noise.shape != x_start.shape:
            raise ValueError(f"noise shape {tuple(noise.shape)} must equal x_start shape {tuple(x_start.shape)}")
        if t is None:
            t = self.sample_time(x_start.shape[0], device=x_start.device)
        elif t.shape != (x_start.shape[0],):
            raise ValueError(f"t must have shape [B] = ({x_start.shape[0]},), got {tuple(t.shape)}")
        x_t = self.add_noise(x_start, noise, t)
        prediction = self._velocity(model, x_t, t, model_kwargs or {})
        return {"loss": mean_flat((prediction - (noise - x_start)) ** 2, loss_mask)}

    def _velocity(self, model: Callable[..., torch.Tensor], x: torch.Tensor, t: torch.Tensor, model_kwargs: dict):
        """The model's velocity at (x [B, C, ...], t [B] in [0, 1]): the first C output channels."""
        out = model(x, t * self.num_timesteps, **model_kwargs)
        channels = x.shape[1]
        if out.shape[0] != x.shape[0] or out.shape[1] < channels:
            raise ValueError(
                f"model output has shape {tuple(out.shape)} for input {tuple(x.shape)}; "
                f"rectified flow needs at least {channels} channels (the velocity) per sample"
            )
        return out[:, :channels]

    @torch.no_grad()
    def sample(
        self,
        model: Callable[..., torch.Tensor],
        shape: Optional[Sequence[int]] = None,
        noise: Optional[torch.Tensor] = None,
        model_kwargs: Optional[dict] = None,
        num_steps: int = 50,
        cfg_scale: Optional[float] = None,
        progress: bool = False,
        generator: Optional[torch.Generator] = None,
        device: Device = None,
    ) -> torch.Tensor:
        """Integrate from noise (t = 1) to data (t = 0) in ``num_steps`` Euler steps; returns x_0.

        Starts from ``noise`` or a standard normal of ``shape`` drawn from ``generator``. With
        ``cfg_scale`` the model is wrapped by ``cfg_model_fn``, which follows the model's
        ``guidance_layout``: DiT's (and a plain function's) doubled batch, ``model_kwargs``
        conditional then unconditional, whose samples are the first half of the result; or the
        video models' B samples paired with their learned null caption inside.
        """
        if num_steps < 1:
            raise ValueError(f"num_steps must be at least 1, got {num_steps}")
        model_fn = model if cfg_scale is None else cfg_model_fn(model, cfg_scale)
        device = resolve_device(model, noise, device, generator)
        x = initial_noise(shape, noise, device, generator)
        # Evenly spaced times from 1 to 0 (then shifted), as Python floats: step sizes need no device sync.
        times = [float(s) for s in self.shift_time(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64))]
        for i in progress_bar(range(num_steps), progress):
            t = torch.full((x.shape[0],), times[i], device=device, dtype=torch.float32)
            velocity = self._velocity(model_fn, x, t, model_kwargs or {})
            x = x + (times[i + 1] - times[i]) * velocity
        return x
