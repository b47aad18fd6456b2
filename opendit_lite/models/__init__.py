from .registry import MODELS, build_model, register_model
