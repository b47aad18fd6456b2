"""The module converter: swap model submodules for fused kernels, other attention backends or
sequence-parallel versions, chosen by config keys, without touching model code.

    from opendit_lite import ModuleConverter
    report = ModuleConverter(config).convert(model)   # in place
    print(report)

Register a conversion for your own module type with ``register_conversion`` (see ``registry.py``
for the factory signature and the order conversions run in). Importing this package registers the
built-in conversions (``builtin.py``) and the sequence-parallel ones (``opendit_lite.parallel``).
"""

from .converter import ConversionReport, ConversionSection, ModuleConverter, Replacement
from .registry import (
    CONFIG_DEFAULTS,
    CONVERSIONS,
    PRIORITY_BACKEND,
    PRIORITY_WRAPPER,
    Conversion,
    ConversionRegistry,
    config_value,
    register_conversion,
)
from .builtin import register_builtin_conversions  # noqa: E402  (registers the built-ins)
from .. import parallel as _parallel  # noqa: E402,F401  (registers the sequence-parallel conversions)

__all__ = [
    "ModuleConverter",
    "ConversionReport",
    "ConversionSection",
    "Replacement",
    "CONFIG_DEFAULTS",
    "CONVERSIONS",
    "PRIORITY_BACKEND",
    "PRIORITY_WRAPPER",
    "Conversion",
    "ConversionRegistry",
    "config_value",
    "register_conversion",
    "register_builtin_conversions",
]
