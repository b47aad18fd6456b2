"""A marker for where a video model may change which axis its sequence-parallel shards cut.

Video tokens are kept as [B, T, S, D] (frames x patches per frame). Serial and Ulysses runs keep
one layout throughout, so the marker is the identity there. Dynamic sequence parallelism (DSP,
``opendit_lite.parallel.dsp.apply_dsp``) replaces each marker with one all-to-all that makes
``scatter_dim`` the sharded axis and gathers ``gather_dim`` whole, so that the attention that
follows runs along a complete local axis with no communication of its own.
"""

import torch
import torch.nn as nn


class SequenceSwitch(nn.Module):
    """Identity; under DSP: tokens sharded along ``gather_dim`` become sharded along ``scatter_dim``."""

    def __init__(self, scatter_dim: int, gather_dim: int):
        super().__init__()
        if scatter_dim == gather_dim:
            raise ValueError(f"SequenceSwitch: scatter_dim and gather_dim must differ, both are {scatter_dim}")
        self.scatter_dim = scatter_dim
        self.gather_dim = gather_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"scatter_dim={self.scatter_dim}, gather_dim={self.gather_dim}"
