"""Sequence parallelism: differentiable collectives, the Ulysses attention ops and the split/gather
boundaries, applied to a serial model from outside with ``apply_sequence_parallel``; DSP for
spatial-temporal models with ``apply_dsp`` (``dsp.py``). ``opendit_lite.transforms.parallelize`` calls one of
the two. Importing the package registers every attention module type of the model zoo, and the
roles attention modules declare (``foreign.py``; the protocol is documented with the adapters
in ``opendit_lite.converter.attention_adapters``); a model without split/gather markers is sharded at its
block list (``boundaries.py``)."""

from .comm import all_to_all, gather_sequence, split_sequence
from .dsp import apply_dsp  # registers the video models' attention types (temporal, cross, joint)
from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState
from .sequence_parallel import (
    SEQUENCE_PARALLEL_ATTENTION,
    apply_sequence_parallel,
    register_sequence_parallel_attention,
)
from .ulysses import SequenceParallelCrossAttentionOp, SequenceParallelOp, UlyssesAttentionOp

__all__ = [
    "apply_dsp",
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
