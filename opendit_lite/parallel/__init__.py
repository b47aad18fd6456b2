"""Sequence parallelism (DeepSpeed-Ulysses): differentiable collectives, SP attention ops and the
split/gather boundaries, applied to a serial model from outside with ``apply_sequence_parallel``."""

from .comm import all_to_all, gather_sequence, split_sequence
from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState
from .sequence_parallel import SEQUENCE_PARALLEL_ATTENTION, apply_sequence_parallel
from .ulysses import SequenceParallelCrossAttentionOp, SequenceParallelOp, UlyssesAttentionOp
from .conversions import register_sequence_parallel_attention  # registers with the module converter

__all__ = [
    "all_to_all",
    "gather_sequence",
    "split_sequence",
    "SequenceParallelGather",
    "SequenceParallelSplit",
    "SequenceParallelState",
    "SEQUENCE_PARALLEL_ATTENTION",
    "apply_sequence_parallel",
    "register_sequence_parallel_attention",
    "SequenceParallelCrossAttentionOp",
    "SequenceParallelOp",
    "UlyssesAttentionOp",
]
