from .registry import MODEL_FAMILIES, MODELS, build_model, register_model
from .dit import DiT, DiT_models, DiTBlock, FinalLayer
from ..checkpoint.original_dit import load_original_dit_checkpoint
from .stdit import STDiT
from .vchitect import VchitectXL

__all__ = [
    "MODELS",
    "build_model",
    "register_model",
    "MODEL_FAMILIES",
    "DiT",
    "DiT_models",
    "DiTBlock",
    "FinalLayer",
    "load_original_dit_checkpoint",
    "STDiT",
    "VchitectXL",
]
