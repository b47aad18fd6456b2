"""The sampler of a sampling run, for images and videos alike: ``check_sampler`` (it must fit the
objective the model was trained with) and ``denoise`` (noise -> x_0 by ``sample.sampler``).

* ``euler``: rectified flow's Euler integration from t = 1 to 0 (``diffusion.RectifiedFlow``);
* ``ddpm``: IDDPM's ancestral sampling, respaced to ``sample.num_sampling_steps``;
* ``ddim``: DDIM (eta 0) over the same respaced steps; for v-prediction (CogVideoX) DDIM over
  trailing steps (``diffusion.VPrediction``).

The time shift of rectified flow and the SNR shift of v-prediction are ``diffusion.shift``, as trained.
"""

from typing import Callable

import torch

from ..config import ConfigError
from ..diffusion import RectifiedFlow, VPrediction, create_diffusion

# training objective -> the samplers that fit it
SAMPLERS = {"rflow": ("euler",), "iddpm": ("ddpm", "ddim"), "vpred": ("ddim",)}


def check_sampler(cfg) -> None:
    """``sample.sampler`` fits ``diffusion.objective`` (the trained model's): euler for rectified flow,
    ddpm or ddim for IDDPM, ddim for v-prediction; a ConfigError says which to use otherwise. A
    video config's null takes the first that fits."""
    objective, sampler = cfg.diffusion.objective, cfg.sample.sampler
    fits = SAMPLERS[objective]
    if sampler is None:  # a video config's default: the first that fits, set in place for denoise
        cfg.sample.sampler = fits[0]
        return
    if sampler not in fits:
        raise ConfigError(f"'sample.sampler'={sampler!r} does not fit a model trained with diffusion.objective="
                          f"{objective!r}: use sample.sampler={' or '.join(fits)}.")


def denoise(model_fn: Callable[..., torch.Tensor], noise: torch.Tensor, cfg, model_kwargs: dict, *,
            clip_denoised: bool, device, generator, progress: bool = False) -> torch.Tensor:
    """Run ``sample.sampler`` for ``sample.num_sampling_steps`` from ``noise`` [B, ...] to x_0 [B, ...].

    ``model_fn(x, t, **model_kwargs)`` is the (guided) model; ``generator`` draws the samplers' noise
    per sample (a ``SampleGenerators``); ``clip_denoised`` clamps IDDPM's x_0 predictions to [-1, 1]
    (pixel space)."""
    s = cfg.sample
    shift = 1.0 if cfg.diffusion.shift is None else cfg.diffusion.shift
    if s.sampler == "euler":
        flow = RectifiedFlow(num_timesteps=cfg.diffusion.diffusion_steps, shift=shift)
        return flow.sample(model_fn, noise=noise, model_kwargs=model_kwargs, num_steps=s.num_sampling_steps,
                           progress=progress, generator=generator)
    if cfg.diffusion.objective == "vpred":
        vpred = VPrediction(num_timesteps=cfg.diffusion.diffusion_steps, snr_shift=shift)
        return vpred.sample(model_fn, noise=noise, model_kwargs=model_kwargs, num_steps=s.num_sampling_steps,
                            progress=progress, generator=generator)
    respacing = f"{'ddim' if s.sampler == 'ddim' else ''}{s.num_sampling_steps}"
    diffusion = create_diffusion(respacing, noise_schedule=cfg.diffusion.noise_schedule,
                                 learn_sigma=cfg.model.learn_sigma, diffusion_steps=cfg.diffusion.diffusion_steps)
    loop = diffusion.ddim_sample_loop if s.sampler == "ddim" else diffusion.p_sample_loop
    return loop(model_fn, noise.shape, noise, clip_denoised=clip_denoised, model_kwargs=model_kwargs,
                progress=progress, device=device, generator=generator)
