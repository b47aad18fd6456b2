"""Noise schedulers for training and sampling diffusion transformers.

* ``create_diffusion`` / ``GaussianDiffusion`` / ``SpacedDiffusion``: DiT's discrete Gaussian diffusion
  (epsilon prediction, learned variance, hybrid loss) with DDPM and DDIM samplers and respacing.
* ``RectifiedFlow``: straight-path flow matching with an Euler sampler, for the video models
  (``resolution_shift``: Flux's and LTX-Video's token-count-dependent time shift).
* ``VPrediction``: v-prediction on a zero-terminal-SNR DDPM schedule with a DDIM sampler (CogVideoX).
* ``cfg_model_fn``: classifier-free guidance around any ``model_fn(x, t, **model_kwargs)``.
* ``build_scheduler("iddpm" | "rflow" | "vpred", **kwargs)``: pick one by name from a config.

Typical use, as in DiT::

    diffusion = create_diffusion(timestep_respacing="")          # training: 1000 steps
    t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],), device=x.device)
    loss = diffusion.training_losses(model, x, t, dict(y=y))["loss"].mean()

    sampler = create_diffusion("250")                            # sampling: 250 respaced steps
    z = torch.cat([z, z]); y = torch.cat([y, y_null])            # doubled batch for guidance
    samples = sampler.p_sample_loop(cfg_model_fn(model, 4.0), z.shape, z, clip_denoised=False,
                                    model_kwargs=dict(y=y))[: len(z) // 2]
"""

from .gaussian_diffusion import GaussianDiffusion, LossType, ModelMeanType, ModelVarType
from .guidance import cfg_model_fn
from .iddpm import create_diffusion
from .rectified_flow import RectifiedFlow, resolution_shift
from .registry import SCHEDULERS, build_scheduler, register_scheduler
from .respace import SpacedDiffusion, space_timesteps
from .schedules import get_named_beta_schedule
from .v_prediction import VPrediction

__all__ = [
    "GaussianDiffusion",
    "LossType",
    "ModelMeanType",
    "ModelVarType",
    "RectifiedFlow",
    "SCHEDULERS",
    "SpacedDiffusion",
    "VPrediction",
    "build_scheduler",
    "cfg_model_fn",
    "create_diffusion",
    "get_named_beta_schedule",
    "register_scheduler",
    "resolution_shift",
    "space_timesteps",
]
