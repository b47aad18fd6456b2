from .attention import Attention, AttentionOp, SDPAAttentionOp
from .modulate import LayerNormModulate, modulate
from .sequence import SequenceGather, SequenceSplit

__all__ = [
    "Attention",
    "AttentionOp",
    "SDPAAttentionOp",
    "LayerNormModulate",
    "modulate",
    "SequenceGather",
    "SequenceSplit",
]
