"""DSP (dynamic sequence parallelism) for spatial-temporal models such as STDiT.

DSP (Zhao et al., "DSP: Dynamic Sequence Parallelism for Multi-Dimensional Transformers", 2024):
rather than exchanging q/k/v and outputs around every attention whose axis is sharded (four
all-to-alls of the activations per spatial attention), re-shard the activations themselves so the
next attention runs along a whole local axis: STDiT's ``to_frames`` switch (before spatial
attention) makes each rank hold whole frames, its ``to_patches`` switch (before temporal
attention) whole frame sequences at a subset of patches. Two all-to-alls of [B, T, S, D] per block
and no attention op communicates; every attention head stays on every rank, so the head count
need not be divisible by the SP size. ``apply_dsp`` swaps the markers; attention ops stay serial.
"""

from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from opendit_lite.models.layers.sequence import SequenceGather, SequenceSplit
from opendit_lite.models.layers.sequence_switch import SequenceSwitch

from .comm import all_to_all, pad_along, padded_length
from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState

# ----------------------------------------------------------------------------------------------
# DSP
# ----------------------------------------------------------------------------------------------

class DSPState(SequenceParallelState):
    """Adds the true (unpadded) length of every axis that has been sharded, keyed by axis, so a
    switch can drop the padding of the axis it gathers whole."""

    def __init__(self, group: Optional[dist.ProcessGroup]):
        super().__init__(group)
        self.lengths: Dict[int, int] = {}


class DSPSplit(SequenceParallelSplit):
    """``SequenceParallelSplit`` that also records the split axis' length for the switches."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.lengths[self.dim] = x.size(self.dim)
        return super().forward(x)


class DSPSwitch(nn.Module):
    """One all-to-all: ``x`` sharded along ``gather_dim`` -> sharded along ``scatter_dim``.

    The axis being scattered is whole here, so its length is recorded and it is padded to a
    multiple of the SP size; the axis being gathered comes back padded and is cut to the length
    recorded when it was scattered.
    """

    def __init__(self, state: DSPState, scatter_dim: int, gather_dim: int):
        super().__init__()
        self.state = state
        self.scatter_dim = scatter_dim
        self.gather_dim = gather_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.state
        if self.gather_dim not in state.lengths:
            raise RuntimeError(f"DSP switch gathers axis {self.gather_dim}, which no split or earlier switch "
                               f"sharded; the model's SequenceSplit must shard that axis first")
        length = x.size(self.scatter_dim)
        state.lengths[self.scatter_dim] = length
        x = pad_along(x, self.scatter_dim, padded_length(length, state.size))
        x = all_to_all(x, state.group, scatter_dim=self.scatter_dim, gather_dim=self.gather_dim)
        return x.narrow(self.gather_dim, 0, state.lengths[self.gather_dim])

    def extra_repr(self) -> str:
        return f"scatter_dim={self.scatter_dim}, gather_dim={self.gather_dim}, sp_size={self.state.size}"


def apply_dsp(model: nn.Module, sp_group: Optional[dist.ProcessGroup]) -> nn.Module:
    """Make ``model`` DSP-parallel over ``sp_group`` in place and return it.

    Swaps the model's ``SequenceSplit``/``SequenceGather``/``SequenceSwitch`` markers; attention ops
    are left as they are, because the switches put each attention's axis whole on every rank. A
    group of one rank leaves the model untouched. A model without switches (or split/gather
    markers) is refused: DSP needs the model to say where its attention axes change.
    """
    state = DSPState(sp_group)
    if state.size == 1:
        return model
    markers = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, (SequenceSplit, SequenceGather, SequenceSwitch))]
    kinds = {kind: sum(isinstance(m, kind) for _, _, m in markers)
             for kind in (SequenceSplit, SequenceGather, SequenceSwitch)}
    if not all(kinds.values()):
        raise ValueError(f"{type(model).__qualname__} has {kinds[SequenceSplit]} SequenceSplit, "
                         f"{kinds[SequenceGather]} SequenceGather and {kinds[SequenceSwitch]} SequenceSwitch "
                         f"markers; DSP needs all three (STDiT has them; use Ulysses for other models)")
    for parent, name, marker in markers:
        if isinstance(marker, SequenceSplit):
            replacement = DSPSplit(state, dim=marker.dim)
        elif isinstance(marker, SequenceGather):
            replacement = SequenceParallelGather(state, dim=marker.dim)
        else:
            replacement = DSPSwitch(state, marker.scatter_dim, marker.gather_dim)
        parent.register_module(name, replacement)
    return model


__all__ = ["DSPState", "DSPSplit", "DSPSwitch", "apply_dsp"]
