"""The sequence-parallel versions of the model's ``SequenceSplit``/``SequenceGather`` markers, and
the small per-model state they share with the sequence-parallel attention ops.

A serial model marks where its tokens may be sharded (after the embeddings) and gathered (before
the final layer) with identity modules; ``apply_sequence_parallel`` swaps those markers for the
modules below and wraps the attention ops, all around one ``SequenceParallelState``. The split
records the true sequence length there on every forward, so the attention ops know how much
padding to strip and the gather knows how much to drop, without the model passing lengths around.
"""

import copy
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from .comm import check_replicated, gather_sequence, group_rank, group_size, padded_length, split_sequence


class SequenceParallelState:
    """What the split, the attention ops and the gather of one model share.

    ``group`` is the SP process group (fixed); ``seq_len`` is the unpadded length along the split
    dimension, written by ``SequenceParallelSplit`` on each forward. Deep-copying a converted model
    (e.g. for an EMA copy) gives the copy its own state that refers to the same process group:
    process groups are handles to a communicator and cannot be copied.

    Each forward overwrites ``seq_len``; activation checkpointing recomputes blocks during backward
    with the value of the latest forward, so run a model's forward and backward before a forward
    of a different length (ordinary training and gradient accumulation do).
    """

    def __init__(self, group: Optional[dist.ProcessGroup]):
        self.group = group
        self.size = group_size(group)
        self.rank = group_rank(group)
        self.seq_len: Optional[int] = None

    def __deepcopy__(self, memo):
        clone = copy.copy(self)  # shares the group handle, copies the ints
        memo[id(self)] = clone
        return clone

    def padded_len(self) -> int:
        """Length of the padded full sequence that the all-to-all reassembles."""
        return padded_length(self.require_seq_len(), self.size)

    def require_seq_len(self) -> int:
        if self.seq_len is None:
            raise RuntimeError(
                "sequence-parallel op ran before the model's SequenceParallelSplit: the model must "
                "pass its tokens through the SequenceSplit marker (self.seq_split) before attention"
            )
        return self.seq_len

    def __repr__(self) -> str:
        return f"SequenceParallelState(size={self.size}, rank={self.rank}, seq_len={self.seq_len})"


class SequenceParallelSplit(nn.Module):
    """Keeps this rank's shard of the (replicated) tokens along ``dim``, padding to a multiple of
    the SP size, and records the true length in the shared state.

    The first forward also checks that the SP ranks really hold the same tokens: ranks seeded
    differently (per global rank instead of per data-parallel rank) would draw different noise
    and timesteps, and each would keep a shard of a different sample, silently training on
    garbage. Later forwards skip the check (it costs a collective and a host sync).
    """

    def __init__(self, state: SequenceParallelState, dim: int = 1):
        super().__init__()
        self.state = state
        self.dim = dim
        self.checked = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.checked:
            check_replicated(x, self.state.group, "tokens at the SequenceSplit")
            self.checked = True
        self.state.seq_len = x.size(self.dim)
        return split_sequence(x, self.state.group, self.dim)  # [B, ceil(N / P), D] for dim=1

    def extra_repr(self) -> str:
        return f"dim={self.dim}, sp_size={self.state.size}"


class SequenceParallelGather(nn.Module):
    """All-gathers the shards along ``dim`` and drops the split's padding."""

    def __init__(self, state: SequenceParallelState, dim: int = 1):
        super().__init__()
        self.state = state
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = self.state.require_seq_len()
        return gather_sequence(x, self.state.group, self.dim, length)  # [B, N, D] for dim=1

    def extra_repr(self) -> str:
        return f"dim={self.dim}, sp_size={self.state.size}"
