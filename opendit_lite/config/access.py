"""Read one setting from a config object of any shape: a ``TrainConfig``, an EasyDict or namespace
(LiteGen configs), or a plain mapping; a setting it lacks takes ``TrainConfig``'s default."""

from collections.abc import Mapping
from typing import Any

from .schema import TrainConfig

_DEFAULTS = TrainConfig()


def config_get(config: Any, key: str) -> Any:
    """``config.a.b`` for ``key="a.b"`` on attribute- or key-access configs; a missing field (or a
    None config) takes TrainConfig's default (None when TrainConfig has no such field)."""
    value, default = config, _DEFAULTS
    for part in key.split("."):
        default = getattr(default, part, None)
        if isinstance(value, Mapping):
            value = value.get(part)
        else:
            value = getattr(value, part, None)
        if value is None:
            return default
    return value
