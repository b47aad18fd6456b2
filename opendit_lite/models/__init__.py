from .dit import DiT, DiT_models, DiTBlock, FinalLayer
from .registry import MODELS, build_model, register_model, registered_class
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
    "STDiT",
    "VchitectXL",
]
