"""v-prediction on a discrete DDPM schedule (Salimans & Ho 2022), the objective CogVideoX trains with.

Convention (that of diffusers' ``CogVideoXDDIMScheduler`` configs):

* 1000 integer timesteps, betas ``scaled_linear`` from 0.00085 to 0.012 (``linspace`` of their
  square roots, squared), ``alpha_bar_t`` their cumulative product of ``1 - beta``;
* ``snr_shift`` s divides the signal-to-noise ratio by s: ``alpha_bar <- alpha_bar / (s + (1 - s) * alpha_bar)``
  (CogVideoX-2B trains with 3, the 5B and 1.5 models with 1);
* the schedule is rescaled to a zero terminal SNR (Lin et al. 2024): ``sqrt(alpha_bar)`` is moved
  and scaled so its last value is 0 and its first unchanged, so the last timestep is pure noise;
* ``x_t = sqrt(alpha_bar_t) x_0 + sqrt(1 - alpha_bar_t) noise``; the model predicts
  ``v = sqrt(alpha_bar_t) noise - sqrt(1 - alpha_bar_t) x_0``, trained with the MSE to it (the
  same loss as CogVideoX's x_0 error weighted by ``1 / (1 - alpha_bar_t)``);
* sampling is DDIM (eta 0) over evenly spaced timesteps ending at the last one ("trailing").
"""

from typing import Callable, Dict, Optional, Sequence

import torch

from .guidance import cfg_model_fn
from .likelihood import mean_flat
from .registry import register_scheduler
from .sampling_utils import Device, initial_noise, progress_bar, resolve_device


def v_prediction_alphas_cumprod(num_timesteps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012,
                                snr_shift: float = 1.0) -> torch.Tensor:
    """``alpha_bar`` [num_timesteps] (float64) of the schedule in the module docstring."""
    betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, num_timesteps, dtype=torch.float64) ** 2
    alpha_bar = torch.cumprod(1 - betas, dim=0)
    alpha_bar = alpha_bar / (snr_shift + (1 - snr_shift) * alpha_bar)
    root = alpha_bar.sqrt()
    first, last = root[0].clone(), root[-1].clone()
    root = (root - last) * first / (first - last)   # zero terminal SNR, first value kept
    return root ** 2


@register_scheduler("vpred")
class VPrediction:
    """v-prediction training loss and DDIM sampler on the schedule of the module docstring.

    Args:
        num_timesteps: discrete timesteps; the model is called with the integer timestep.
        snr_shift: divides the signal-to-noise ratio (1 = none).
    """

    def __init__(self, num_timesteps: int = 1000, snr_shift: float = 1.0):
        if num_timesteps <= 1:
            raise ValueError(f"num_timesteps must be at least 2, got {num_timesteps}")
        if snr_shift <= 0:
            raise ValueError(f"snr_shift must be positive (1 means no shift), got {snr_shift}")
        self.num_timesteps = num_timesteps
        self.alphas_cumprod = v_prediction_alphas_cumprod(num_timesteps, snr_shift=snr_shift)

    def _coefficients(self, t: torch.Tensor, like: torch.Tensor):
        """(sqrt(alpha_bar_t), sqrt(1 - alpha_bar_t)) for t [B], shaped to broadcast over ``like``."""
        a = self.alphas_cumprod.to(like.device)[t.long()].view(-1, *([1] * (like.dim() - 1)))
        return a.sqrt().to(like.dtype), (1 - a).sqrt().to(like.dtype)

    def add_noise(self, x_start: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        signal, sigma = self._coefficients(t, x_start)
        return signal * x_start + sigma * noise

    def velocity(self, x_start: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The target ``v = sqrt(alpha_bar) noise - sqrt(1 - alpha_bar) x_0``."""
        signal, sigma = self._coefficients(t, x_start)
        return signal * noise - sigma * x_start

    def training_losses(self, model: Callable[..., torch.Tensor], x_start: torch.Tensor, t: torch.Tensor,
                        model_kwargs: Optional[dict] = None, noise: Optional[torch.Tensor] = None
                        ) -> Dict[str, torch.Tensor]:
        """``{"loss": [B]}``: the per-sample MSE between the predicted and the true v at integer
        timesteps ``t`` [B] (the first C output channels are read)."""
        noise = torch.randn_like(x_start) if noise is None else noise
        x_t = self.add_noise(x_start, noise, t)
        prediction = model(x_t, t, **(model_kwargs or {}))[:, : x_start.shape[1]]
        return {"loss": mean_flat((prediction - self.velocity(x_start, noise, t)) ** 2)}

    def sampling_timesteps(self, num_steps: int) -> Sequence[int]:
        """``num_steps`` evenly spaced timesteps from the last one down ("trailing" spacing)."""
        step = self.num_timesteps / num_steps
        return [int(round(self.num_timesteps - i * step)) - 1 for i in range(num_steps)]

    @torch.no_grad()
    def sample(self, model: Callable[..., torch.Tensor], shape: Optional[Sequence[int]] = None,
               noise: Optional[torch.Tensor] = None, model_kwargs: Optional[dict] = None, num_steps: int = 50,
               cfg_scale: Optional[float] = None, progress: bool = False,
               generator: Optional[torch.Generator] = None, device: Device = None) -> torch.Tensor:
        """DDIM (eta 0) from noise to x_0 in ``num_steps`` steps; ``cfg_scale`` as ``RectifiedFlow.sample``."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be at least 1, got {num_steps}")
        model_fn = model if cfg_scale is None else cfg_model_fn(model, cfg_scale)
        device = resolve_device(model, noise, device, generator)
        x = initial_noise(shape, noise, device, generator)
        steps = self.sampling_timesteps(num_steps)
        for i in progress_bar(range(num_steps), progress):
            t = torch.full((x.shape[0],), steps[i], device=device, dtype=torch.long)
            v = model_fn(x, t, **(model_kwargs or {}))[:, : x.shape[1]]
            signal, sigma = self._coefficients(t, x)
            x0 = signal * x - sigma * v                    # the clean sample the model implies
            eps = sigma * x + signal * v                   # and its noise
            if i + 1 < num_steps:
                signal_next, sigma_next = self._coefficients(torch.full_like(t, steps[i + 1]), x)
                x = signal_next * x0 + sigma_next * eps
            else:
                x = x0
        return x
