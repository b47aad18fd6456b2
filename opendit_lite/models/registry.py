"""Name-keyed model registry: ``register_model("DiT-XL/2")(factory)`` and ``build_model(name, **kw)``."""

import difflib
from typing import Callable, Dict

import torch.nn as nn

MODELS: Dict[str, Callable[..., nn.Module]] = {}
# name -> what the model generates: "image" (class-conditional, train.py) or "video" (text-to-video, train_video.py)
MODEL_FAMILIES: Dict[str, str] = {}


def register_model(name: str, family: str = "image") -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a model factory under ``name`` for ``family`` ("image" or "video");
    a duplicate name is an error."""
    if family not in ("image", "video"):
        raise ValueError(f"model family must be 'image' or 'video', got {family!r}")

    def wrap(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in MODELS:
            raise ValueError(f"model {name!r} is already registered (by {MODELS[name].__module__})")
        MODELS[name] = factory
        MODEL_FAMILIES[name] = family
        return factory

    return wrap


def build_model(name: str, **kwargs) -> nn.Module:
    """Instantiate a registered model; an unknown name lists the closest registered names."""
    if name not in MODELS:
        close = difflib.get_close_matches(name, list(MODELS), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise KeyError(f"unknown model {name!r}.{hint} Registered: {', '.join(sorted(MODELS))}")
    return MODELS[name](**kwargs)
