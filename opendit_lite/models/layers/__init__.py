from .attention import Attention, AttentionOp, SDPAAttentionOp
from .embeddings import (
    LabelEmbedder,
    PatchEmbed,
    TimestepEmbedder,
    get_1d_sincos_pos_embed,
    get_2d_sincos_pos_embed,
    sincos_embed_from_positions,
)
from .modulate import GatedResidualNorm, LayerNormModulate, modulate
from .sequence import SequenceGather, SequenceSplit

__all__ = [
    "Attention",
    "AttentionOp",
    "SDPAAttentionOp",
    "LabelEmbedder",
    "PatchEmbed",
    "TimestepEmbedder",
    "get_1d_sincos_pos_embed",
    "get_2d_sincos_pos_embed",
    "sincos_embed_from_positions",
    "GatedResidualNorm",
    "LayerNormModulate",
    "modulate",
    "SequenceGather",
    "SequenceSplit",
]
