from .registry import MODELS, build_model, register_model, registered_class
from .dit import DiT, DiT_models, DiTBlock, FinalLayer
from ..checkpoint.original_dit import load_original_dit_checkpoint
from .stdit import STDiT
from .vchitect import VchitectXL

__all__ = [
    "MODELS",
    "build_model",
    "register_model",
    "registered_class",
    "DiT",
    "DiT_models",
    "DiTBlock",
    "FinalLayer",
    "load_original_dit_checkpoint",
    "STDiT",
    "VchitectXL",
]
