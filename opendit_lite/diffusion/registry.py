"""Name-keyed registry of noise schedulers: ``build_scheduler("iddpm" | "rflow", **kwargs)``.

A training or sampling script picks its scheduler by name from its config; each name maps to a
factory taking that scheduler's own keyword arguments (``create_diffusion`` for "iddpm",
``RectifiedFlow`` for "rflow").
"""

from typing import Any, Callable, Dict

SCHEDULERS: Dict[str, Callable[..., Any]] = {}


def register_scheduler(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a scheduler factory under ``name``; a duplicate name is an error."""

    def wrap(factory: Callable[..., Any]) -> Callable[..., Any]:
        if name in SCHEDULERS:
            raise ValueError(f"scheduler {name!r} is already registered (by {SCHEDULERS[name].__module__})")
        SCHEDULERS[name] = factory
        return factory

    return wrap


def build_scheduler(name: str, **kwargs) -> Any:
    """Build the scheduler registered as ``name`` with the factory's keyword arguments."""
    if name not in SCHEDULERS:
        raise KeyError(f"unknown scheduler {name!r}; registered schedulers: {', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name](**kwargs)
