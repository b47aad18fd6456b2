"""Recognise a class of another library without importing it.

Conversions for timm's and diffusers' modules match the exact class, looked up in ``sys.modules``:
a model built from that library has imported it already, and a program that never imports it
never pays for the import (diffusers takes seconds) just because a conversion is registered.
"""

import sys
from typing import Optional


def loaded_class(module_name: str, class_name: str) -> Optional[type]:
    """``module_name.class_name`` when that module is already imported, else None."""
    module = sys.modules.get(module_name)
    return getattr(module, class_name, None) if module is not None else None


def is_exactly(obj: object, module_name: str, class_name: str) -> bool:
    """True when ``obj``'s class is exactly ``module_name.class_name`` (not a subclass, whose
    forward may differ), with that module already imported."""
    cls = loaded_class(module_name, class_name)
    return cls is not None and type(obj) is cls
