"""A package whose names are imported on first use (PEP 562), so that importing the package itself
imports none of its submodules (no torch): a command can check its arguments before the seconds of
importing them."""

import importlib
from typing import Any, Callable, Dict


def lazy_exports(package: str, table: Dict[str, str]) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``package``: ``name`` in ``table`` (name -> submodule) is read
    from its submodule, imported then; any other name is an AttributeError as usual."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
