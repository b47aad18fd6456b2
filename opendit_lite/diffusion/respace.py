"""Respacing: sample with a subset of a trained diffusion's timesteps (DDIM-50, IDDPM-250, ...).

Keeping timesteps ``s_0 < s_1 < ... < s_{K-1}`` of the original process and giving the new process
the betas ``1 - alpha_bar[s_k] / alpha_bar[s_{k-1}]`` (with ``alpha_bar[s_{-1}] = 1``) makes its
cumulative signal levels exactly the original ones at the kept steps, so a model trained on the
original process is still correct there: it is simply called with the original timestep
``s_k`` when the respaced process is at index ``k``.
"""

from typing import Iterable, Sequence, Set, Union

import torch

from .gaussian_diffusion import GaussianDiffusion

SectionCounts = Union[str, int, Sequence[int]]


def _ddim_stride_steps(num_timesteps: int, count: int) -> Set[int]:
    """``range(0, num_timesteps, stride)`` for the smallest integer stride that yields ``count`` steps."""
    for stride in range(1, num_timesteps):
        steps = range(0, num_timesteps, stride)
        if len(steps) == count:
            return set(steps)
    raise ValueError(
        f"no integer stride takes exactly {count} of {num_timesteps} steps for 'ddim{count}'; "
        "pick a count that divides the steps more evenly or use a plain count such as "
        f"'{count}' (evenly spread, not strided)"
    )


def space_timesteps(num_timesteps: int, section_counts: SectionCounts) -> Set[int]:
    """Which original timesteps to keep, as a set of indices in ``[0, num_timesteps)``.

    * ``"ddimN"``: the DDIM rule, an integer stride from 0: ``{0, s, 2s, ...}`` with exactly N
      steps, for the smallest such stride s (``"ddim25"`` of 1000 is ``{0, 40, ..., 960}``).
    * ``"N"``, ``N`` or ``[N]``: N steps spread evenly (with rounding) from the first to the last.
    * ``"N1,N2,..."`` or ``[N1, N2, ...]``: the steps are cut into that many equal sections (the
      first ``num_timesteps % len`` sections one step longer) and section i gets ``Ni`` evenly spread
      steps, e.g. ``"10,15,20"`` spends more of the sampling budget on the noisier steps.
    """
    if isinstance(section_counts, str):
        if section_counts.startswith("ddim"):
            return _ddim_stride_steps(num_timesteps, int(section_counts[len("ddim"):]))
        try:
            section_counts = [int(part) for part in section_counts.split(",")]
        except ValueError:
            raise ValueError(
                f"cannot parse timestep respacing {section_counts!r}: expected 'ddimN', 'N' or 'N1,N2,...'"
            ) from None
    elif isinstance(section_counts, int):
        section_counts = [section_counts]
    section_counts = list(section_counts)
    if not section_counts:
        raise ValueError("timestep respacing needs at least one section count")

    base_size, remainder = divmod(num_timesteps, len(section_counts))
    steps = set()
    start = 0
    for i, count in enumerate(section_counts):
        size = base_size + (1 if i < remainder else 0)
        if not 1 <= count <= size:
            raise ValueError(f"section {i} has {size} timesteps, so it cannot take {count} of them")
        # count points from the section's first step to its last, rounded to integers. The position
        # is accumulated step by step (not k * stride) because that is how IDDPM and DiT compute it,
        # and the two differ at rounding ties often enough to change which timesteps are kept.
        stride = (size - 1) / (count - 1) if count > 1 else 1
        position = 0.0
        for _ in range(count):
            steps.add(start + round(position))
            position += stride
        start += size
    return steps


class SpacedDiffusion(GaussianDiffusion):
    """A ``GaussianDiffusion`` over the kept timesteps ``use_timesteps`` of one built from ``betas``.

    Its timesteps are indices ``0 .. len(use_timesteps) - 1``; every model call receives the
    corresponding original timestep (``timestep_map[t]``). Training with all timesteps kept is the
    same as training the original diffusion, which is what DiT does (``create_diffusion("")``).
    """

    def __init__(self, use_timesteps: Iterable[int], *, betas: Sequence[float], **kwargs):
        original_betas = torch.as_tensor(betas, dtype=torch.float64)
        self.original_num_steps = len(original_betas)
        kept = sorted(set(int(s) for s in use_timesteps))
        if not kept or kept[0] < 0 or kept[-1] >= self.original_num_steps:
            raise ValueError(
                f"use_timesteps must be a non-empty subset of [0, {self.original_num_steps}), "
                f"got {len(kept)} steps spanning {kept[:1]}..{kept[-1:]}"
            )
        self.use_timesteps = set(kept)
        self.timestep_map = torch.tensor(kept, dtype=torch.long)

        alphas_cumprod = torch.cumprod(1.0 - original_betas, dim=0)[self.timestep_map]
        previous = torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
        super().__init__(betas=1.0 - alphas_cumprod / previous, **kwargs)

    def _model_timesteps(self, t: torch.Tensor) -> torch.Tensor:
        return self._table("timestep_map", t.device)[t]
