"""Classifier-free guidance arithmetic (Ho & Salimans 2022) for the two batch layouts a model can
declare in ``guidance_layout`` (see ``capabilities.py``): the models' ``forward_with_cfg`` call it
directly, and the samplers reach it through ``opendit_lite.diffusion.cfg_model_fn``, which picks the
layout from the model's declaration.

The model runs once on a batch of 2B (conditional inputs first, unconditional second) and its
prediction is pushed away from the unconditional one: ``guided = uncond + cfg_scale * (cond -
uncond)`` on the leading ``channels`` output channels; ``cfg_scale = 1`` is plain conditional
sampling.

``concat_guided`` (DiT; also any plain function without the attribute)
    The caller doubles the batch: the sampler's state ``x`` is ``[2B, ...]`` and ``model_kwargs``
    hold the 2B conditions (e.g. ``y = cat([labels, null_labels])``). Only the first half of ``x``
    is read and the guided prediction is returned for both halves, so the first half follows the
    guided trajectory whatever the second half holds (a stochastic sampler adds different noise to
    it); the samples are ``samples[:B]``. Channels past ``channels`` (a learned variance) are each
    half's own output. [2B] -> [2B].

``paired_guided`` (STDiT, the Vchitect-style model)
    The caller passes B samples with their captions ``y`` [B, M, Cy] (and ``mask`` [B, M]); the
    unconditional half uses the model's learned null caption ``model.null_caption(B)`` with a full
    mask. Channels past ``channels`` are the conditional output. [B] -> [B].

``channels`` is how many leading output channels are guided; ``None`` guides as many as ``x`` has:
the noise / velocity prediction, leaving a learned-variance block untouched.
"""

from typing import Callable, Optional, Tuple

import torch


def guide(out: torch.Tensor, cfg_scale: float, channels: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Split the model output ``out`` [2B, C_out, ...] (conditional half first) into the guided
    prediction [B, channels, ...] and the unguided channels [2B, C_out - channels, ...]."""
    if not 0 < channels <= out.shape[1]:
        raise ValueError(f"guidance channels must be in [1, {out.shape[1]}] (the output channels), got {channels}")
    cond, uncond = out[:, :channels].chunk(2)           # [B, channels, ...] each
    return uncond + cfg_scale * (cond - uncond), out[:, channels:]


def concat_guided(model: Callable[..., torch.Tensor], x: torch.Tensor, t: torch.Tensor, *, cfg_scale: float,
                  channels: Optional[int] = None, **model_kwargs) -> torch.Tensor:
    """The "concat" layout (module docstring): x [2B, C, ...] -> [2B, C_out, ...]."""
    if x.shape[0] % 2 != 0:
        raise ValueError(
            f"classifier-free guidance needs a doubled batch (conditional then unconditional halves), "
            f"got an odd batch of {x.shape[0]}"
        )
    half = x[: x.shape[0] // 2]                                            # [B, C, ...]
    out = model(torch.cat([half, half]), t, **model_kwargs)                # [2B, C_out, ...]
    guided, rest = guide(out, cfg_scale, x.shape[1] if channels is None else channels)
    return torch.cat([torch.cat([guided, guided]), rest], dim=1)           # [2B, C_out, ...]


def paired_guided(model: Callable[..., torch.Tensor], x: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                  mask: Optional[torch.Tensor] = None, *, cfg_scale: float, channels: Optional[int] = None,
                  **model_kwargs) -> torch.Tensor:
    """The "paired" layout (module docstring): x [B, C, ...] -> [B, C_out, ...]."""
    B = x.shape[0]
    y_all = torch.cat([y, model.null_caption(B).to(y.dtype)])              # [2B, M, Cy]
    mask_all = None if mask is None else torch.cat([mask, torch.ones_like(mask)])  # [2B, M]
    out = model(torch.cat([x, x]), torch.cat([t, t]), y_all, mask_all, **model_kwargs)  # [2B, C_out, ...]
    guided, rest = guide(out, cfg_scale, x.shape[1] if channels is None else channels)
    return torch.cat([guided, rest[:B]], dim=1)                            # [B, C_out, ...]
