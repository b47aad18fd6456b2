"""Classifier-free guidance (Ho & Salimans 2022) as a wrapper around any model function.

The model is run once on a doubled batch, conditional inputs first and unconditional (null
label / empty prompt) second, and its prediction is pushed away from the unconditional one:
``guided = uncond + cfg_scale * (cond - uncond)``; ``cfg_scale = 1`` is plain conditional sampling.

The caller doubles the batch, as with DiT's ``forward_with_cfg``: the sampler's state ``x`` is
``[2B, ...]`` and ``model_kwargs`` hold the 2B conditions (e.g. ``y = cat([labels, null_labels])``).
Only the first half of ``x`` is read and the guided prediction is returned for both halves, so
the first half follows the guided trajectory whatever the second half holds (a stochastic sampler
adds different noise to it); the samples are ``samples[:B]``.
"""

from typing import Callable, Optional

import torch


def cfg_model_fn(model_fn: Callable[..., torch.Tensor], cfg_scale: float, channels: Optional[int] = None):
    """Wrap ``model_fn(x, t, **model_kwargs)`` into its classifier-free-guided version.

    ``channels`` is how many leading output channels are guided. ``None`` guides as many as ``x`` has:
    the noise / velocity prediction, leaving a learned-variance block (taken from each half's own
    output) untouched. DiT's ``forward_with_cfg`` guides exactly 3 channels even for 4-channel
    latents; pass ``channels=3`` to reproduce its samples.
    """

    def guided(x: torch.Tensor, t: torch.Tensor, **model_kwargs) -> torch.Tensor:
        if x.shape[0] % 2 != 0:
            raise ValueError(
                f"classifier-free guidance needs a doubled batch (conditional then unconditional halves), "
                f"got an odd batch of {x.shape[0]}"
            )
        half = x[: x.shape[0] // 2]
        out = model_fn(torch.cat([half, half]), t, **model_kwargs)  # [2B, C_out, ...]
        num_guided = x.shape[1] if channels is None else channels
        prediction, rest = out[:, :num_guided], out[:, num_guided:]
        cond, uncond = prediction.chunk(2)  # [B, num_guided, ...] each
        guided_half = uncond + cfg_scale * (cond - uncond)
        return torch.cat([torch.cat([guided_half, guided_half]), rest], dim=1)

    return guided
