"""The model inputs a module declares in ``fp32_inputs`` (diffusion timesteps) keep their dtype when a
ZeRO wrapper casts the inputs to the training dtype.

Rectified-flow times x 1000 are fractional, and bf16 would round them to steps of up to 4 before
the timestep embedder computes its frequencies; the models list such inputs by argument name
(``fp32_inputs = ("t",)``). These helpers find them among a call's arguments and put them back.
"""

import inspect
from typing import Any, Callable, Dict, Tuple

import torch.nn as nn

Args = Tuple[tuple, Dict[str, Any]]


def fp32_inputs_of(module: nn.Module) -> Tuple[str, ...]:
    return tuple(getattr(module, "fp32_inputs", ()))


def kept_arguments(module: nn.Module, args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The values of ``module``'s ``fp32_inputs`` in a call ``module(*args, **kwargs)``, by name."""
    keep = fp32_inputs_of(module)
    if not keep:
        return {}
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    return {name: bound.arguments[name] for name in keep if name in bound.arguments}


def with_arguments(module: nn.Module, args: tuple, kwargs: Dict[str, Any], values: Dict[str, Any],
                   convert: Callable[[Any], Any] = lambda v: v) -> Args:
    """``(args, kwargs)`` of a call of ``module`` with the arguments named in ``values`` replaced by
    them and every other argument passed through ``convert``."""
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    for name, value in bound.arguments.items():
        bound.arguments[name] = values[name] if name in values else convert(value)
    return bound.args, bound.kwargs
