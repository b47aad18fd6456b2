"""Pieces shared by every sampler: the starting noise, the step iterator, the device to sample on.

Samplers accept any ``model_fn(x, t, **model_kwargs)`` callable (a module, a bound method such as
DiT's ``forward_with_cfg``, or a function from ``cfg_model_fn``), so the device cannot always be read
from the model; it is taken from, in order: the ``device`` argument, the given noise, the model's
parameters when it is an ``nn.Module``, the generator, and finally the CPU.
"""

from typing import Callable, Iterable, Optional, Sequence, Union

import torch
import torch.nn as nn

Device = Union[str, torch.device, None]


def resolve_device(
    model: Callable,
    noise: Optional[torch.Tensor],
    device: Device,
    generator: Optional[torch.Generator],
) -> torch.device:
    """The device sampling runs on (see the module docstring for the order of precedence)."""
    if device is not None:
        return torch.device(device)
    if noise is not None:
        return noise.device
    if isinstance(model, nn.Module):
        param = next(model.parameters(), None)
        if param is not None:
            return param.device
    if generator is not None:
        return generator.device
    return torch.device("cpu")


def initial_noise(
    shape: Optional[Sequence[int]],
    noise: Optional[torch.Tensor],
    device: torch.device,
    generator: Optional[torch.Generator],
) -> torch.Tensor:
    """The sampler's starting point: ``noise`` moved to ``device`` or a fresh standard normal of ``shape``."""
    if noise is not None:
        if shape is not None and tuple(shape) != tuple(noise.shape):
            raise ValueError(f"shape {tuple(shape)} disagrees with the given noise of shape {tuple(noise.shape)}")
        return noise.to(device)
    if shape is None:
        raise ValueError("pass either the shape of the samples to draw or the starting noise itself")
    return standard_normal(tuple(shape), generator, device, torch.float32)


def standard_normal(
    shape: Sequence[int], generator: Optional[torch.Generator], device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """A standard normal on ``device``, drawn from ``generator`` (global RNG when None).

    The draw happens on the generator's own device and is then moved, so a CPU generator works for
    CUDA sampling and a given seed gives the same noise on every device.
    """
    if generator is None:
        return torch.randn(shape, device=device, dtype=dtype)
    return torch.randn(shape, generator=generator, device=generator.device, dtype=dtype).to(device)


def standard_normal_like(x: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """``randn_like(x)`` drawn from ``generator`` when one is given (see ``standard_normal``)."""
    return standard_normal(x.shape, generator, x.device, x.dtype)


def progress_bar(steps: Sequence, progress: bool) -> Iterable:
    """``steps`` wrapped in a tqdm bar when ``progress`` is set (tqdm is imported only then)."""
    if not progress:
        return steps
    from tqdm.auto import tqdm

    return tqdm(steps)
