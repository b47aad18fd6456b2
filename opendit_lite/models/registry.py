"""Name-keyed model registry: ``register_model("DiT-XL/2")(factory)`` and ``build_model(name, **kw)``."""

import difflib
from typing import Callable, Dict, Optional

import torch.nn as nn

MODELS: Dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str, model_class: Optional[type] = None
                   ) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a model factory under ``name``; a duplicate name is an error.

    ``model_class``: the class the factory builds, so its declared capabilities (``is_video``,
    ``supported_sp_modes``, ...; see ``capabilities.py``) can be read before building it. Not
    needed when the factory is the class itself."""

    def wrap(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in MODELS:
            raise ValueError(f"model {name!r} is already registered (by {MODELS[name].__module__})")
        if model_class is not None:
            factory.model_class = model_class
        MODELS[name] = factory
        return factory

    return wrap


def register_variant(name: str, model_class: type, **config) -> Callable[..., nn.Module]:
    """Register ``name`` as ``model_class`` built with ``config`` (keyword arguments given to the
    factory override it); returns the factory."""

    def factory(**kwargs) -> nn.Module:
        return model_class(**{**config, **kwargs})

    factory.__name__ = factory.__qualname__ = name.replace("-", "_").replace("/", "_")
    factory.__doc__ = f"{name}: {config}; keyword arguments override them and go to {model_class.__name__}."
    return register_model(name, model_class=model_class)(factory)


def registered_class(name: str) -> Optional[type]:
    """The class the model registered as ``name`` builds (None when its factory did not say)."""
    factory = MODELS[name]
    return factory if isinstance(factory, type) else getattr(factory, "model_class", None)


def build_model(name: str, **kwargs) -> nn.Module:
    """Instantiate a registered model; an unknown name lists the closest registered names."""
    if name not in MODELS:
        close = difflib.get_close_matches(name, list(MODELS), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise KeyError(f"unknown model {name!r}.{hint} Registered: {', '.join(sorted(MODELS))}")
    return MODELS[name](**kwargs)
