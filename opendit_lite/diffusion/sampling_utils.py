"""Pieces shared by every sampler: the starting noise, the step iterator, the device to sample on.

Samplers accept any ``model_fn(x, t, **model_kwargs)`` callable (a module, a bound method such as
DiT's ``forward_with_cfg``, or a function from ``cfg_model_fn``), so the device cannot always be read
from the model; it is taken from, in order: the ``device`` argument, the given noise, the model's
parameters when it is an ``nn.Module``, the generator, and finally the CPU.

``generator`` may also be a ``SampleGenerators``: one generator per sample, so that each sample's
noise depends only on the seed and its own index, not on which other samples share its batch, rank
or world size (what data-parallel sampling needs to reproduce a one-process run).
"""

from typing import Callable, Iterable, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn


def sample_seed(seed: int, index: int, *stream: int) -> int:
    """A well-mixed 64-bit seed for sample ``index`` of a run seeded with ``seed`` (all >= 0);
    neighbouring (seed, index) pairs give unrelated streams. ``stream`` adds keys, e.g. the
    training step (a training example's draws at step s: ``sample_seed(seed, index, s)``)."""
    return int(np.random.SeedSequence([seed, index, *stream]).generate_state(1, dtype=np.uint64)[0])


class SampleGenerators:
    """One CPU ``torch.Generator`` per sample, seeded by ``sample_seed(seed, index, *stream)``.

    A draw of shape [N, ...] takes row r from generator ``r % len(self)``, so N must be a multiple
    of the number of samples: the doubled batch of classifier-free guidance ([conditional;
    unconditional]) draws each sample's two rows from that sample's own generator, conditional
    row first. Draws happen on the CPU and are moved, as ``standard_normal`` does for a generator.
    """

    device = torch.device("cpu")

    def __init__(self, seed: int, indices: Sequence[int], stream: Sequence[int] = ()):
        if seed < 0:
            raise ValueError(f"the sampling seed must be >= 0, got {seed}")
        self.indices = list(indices)
        self.generators: List[torch.Generator] = [torch.Generator().manual_seed(sample_seed(seed, i, *stream))
                                                  for i in self.indices]

    def __len__(self) -> int:
        return len(self.generators)

    def standard_normal(self, shape: Sequence[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return self._rows(torch.randn, shape, device, dtype)  # [N, ...]

    def uniform(self, shape: Sequence[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Uniform on [0, 1), row r from generator ``r % len(self)`` as ``standard_normal``."""
        return self._rows(torch.rand, shape, device, dtype)  # [N, ...]

    def _rows(self, draw, shape: Sequence[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        n = len(self.generators)
        if n == 0 or shape[0] % n != 0:
            raise ValueError(f"a draw of {shape[0]} rows does not split over {n} per-sample generators")
        rows = [draw(tuple(shape[1:]), generator=self.generators[r % n], dtype=dtype) for r in range(shape[0])]
        out = torch.stack(rows)  # [N, ...]
        if torch.device(device).type == "cuda":  # pinned + non_blocking: the host does not wait for the GPU
            return out.pin_memory().to(device, non_blocking=True)
        return out.to(device)

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
    if isinstance(generator, SampleGenerators):
        return generator.standard_normal(shape, device, dtype)
    if generator is None:
        return torch.randn(shape, device=device, dtype=dtype)
    return torch.randn(shape, generator=generator, device=generator.device, dtype=dtype).to(device)


def standard_uniform(
    shape: Sequence[int], generator: Optional[torch.Generator], device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Uniform on [0, 1) on ``device``, drawn from ``generator`` as ``standard_normal`` draws."""
    if isinstance(generator, SampleGenerators):
        return generator.uniform(shape, device, dtype)
    if generator is None:
        return torch.rand(shape, device=device, dtype=dtype)
    return torch.rand(shape, generator=generator, device=generator.device, dtype=dtype).to(device)


def standard_normal_like(x: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """``randn_like(x)`` drawn from ``generator`` when one is given (see ``standard_normal``)."""
    return standard_normal(x.shape, generator, x.device, x.dtype)


def progress_bar(steps: Sequence, progress: bool) -> Iterable:
    """``steps`` wrapped in a tqdm bar when ``progress`` is set (tqdm is imported only then)."""
    if not progress:
        return steps
    from tqdm.auto import tqdm

    return tqdm(steps)
