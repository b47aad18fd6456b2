"""Sequence parallelism: differentiable collectives, the Ulysses attention ops and the split/gather
boundaries, applied to a serial model from outside with ``apply_sequence_parallel`` (or the module
converter with ``sp_size > 1``); DSP for spatial-temporal models with ``apply_dsp`` (``dsp.py``).
Importing the package registers every attention module type of the model zoo, and the adapters
of timm's and diffusers' attention (``foreign.py``, which also documents the attention protocol
any other module can follow); models without split/gather markers are sharded at their block
list (``boundaries.py``)."""

from .comm import all_to_all, gather_sequence, split_sequence
from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState
from .sequence_parallel import SEQUENCE_PARALLEL_ATTENTION, apply_sequence_parallel
from .ulysses import SequenceParallelCrossAttentionOp, SequenceParallelOp, UlyssesAttentionOp
from .conversions import register_sequence_parallel_attention  # registers with the module converter
from .foreign import PROTOCOL as ATTENTION_PROTOCOL, OpAttnProcessor, OpCrossAttnProcessor
from .dsp import apply_dsp  # registers the video models' attention types (temporal, cross, joint)

__all__ = [
    "ATTENTION_PROTOCOL",
    "OpAttnProcessor",
    "OpCrossAttnProcessor",
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
