"""Sequence-parallel boundaries: identity modules that mark where a model's token sequence may be
split across a sequence-parallel group (after the embeddings) and gathered back (before the final
layer). Serial models run them as identities; the sequence-parallel conversion swaps them for
modules that scatter/gather over the group, so model code never changes between serial and SP runs.
"""

import torch
import torch.nn as nn


class _SequenceBoundary(nn.Module):
    """An identity on tokens whose sequence axis is ``dim``; subclasses name which boundary it is."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class SequenceSplit(_SequenceBoundary):
    """Marks the point after which tokens (e.g. ``[B, N, D]``) may be sharded along ``dim``."""


class SequenceGather(_SequenceBoundary):
    """Marks the point where sharded tokens are gathered back to the full sequence along ``dim``."""
