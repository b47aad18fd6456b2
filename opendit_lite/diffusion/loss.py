"""The training loss of a batch under either objective: rectified flow (a time in [0, 1] per
sample) or IDDPM (a uniform integer timestep per sample), with each sample's noise and time drawn
from its own stream when the trainer passes one."""

from typing import Optional

import torch

from .rectified_flow import RectifiedFlow
from .sampling_utils import SampleGenerators, standard_normal_like, standard_uniform


def objective_loss(objective, model, x: torch.Tensor, model_kwargs: dict,
                   generator: Optional[SampleGenerators] = None) -> torch.Tensor:
    """Mean training loss of a batch x [B, ...] (clean latents or pixels, images or clips) under
    rectified flow (a time in [0, 1] per sample) or IDDPM (a uniform integer timestep per sample).

    ``generator``: one stream per sample (``SampleGenerators``) for its noise and time, so that a
    sample's draws do not depend on the rank or micro-batch it lands in; None: the global RNG.

    A model that keeps some latents as given (``model.loss_mask(x)`` returns a 0/1 tensor, e.g. a
    pipeline's first frame given by the image) is trained on the others only (rectified flow)."""
    noise = standard_normal_like(x, generator)                                    # [B, ...]
    mask_of = getattr(model, "loss_mask", None)
    loss_mask = mask_of(x) if callable(mask_of) else None
    if isinstance(objective, RectifiedFlow):
        t = objective.sample_time(x.shape[0], device=x.device, generator=generator)  # [B] in [0, 1]
        return objective.training_losses(model, x, model_kwargs=model_kwargs, noise=noise, t=t,
                                         loss_mask=loss_mask)["loss"].mean()
    if loss_mask is not None:
        raise ValueError("a loss mask is supported by rectified flow only")
    u = standard_uniform((x.shape[0],), generator, x.device, torch.float64)         # [B] in [0, 1)
    t = (u * objective.num_timesteps).long().clamp_(max=objective.num_timesteps - 1)  # [B] integer steps
    return objective.training_losses(model, x, t, model_kwargs=model_kwargs, noise=noise)["loss"].mean()
