"""The module converter: swap model submodules for fused kernels or other attention backends,
chosen by explicit keywords, without touching model code.

    from opendit_lite import ModuleConverter
    report = ModuleConverter(fused_adaln=True, attention_backend="auto").convert(model)   # in place
    print(report)

Register a conversion for your own module type with ``register_conversion`` (see ``registry.py``
for the factory signature and the order conversions run in). Importing this package registers the
built-in conversions (``builtin.py``). Sequence parallelism is not a conversion:
``opendit_lite.parallelize`` applies it with ``opendit_lite.parallel``.
"""

from .converter import ConversionReport, ConversionSection, ModuleConverter, Replacement
from .registry import (
    CONVERSIONS,
    PRIORITY_BACKEND,
    PRIORITY_WRAPPER,
    Conversion,
    ConversionRegistry,
    ConverterOptions,
    register_conversion,
)
from .builtin import register_builtin_conversions  # noqa: E402  (registers the built-ins)

__all__ = [
    "ModuleConverter",
    "ConversionReport",
    "ConversionSection",
    "ConverterOptions",
    "Replacement",
    "CONVERSIONS",
    "PRIORITY_BACKEND",
    "PRIORITY_WRAPPER",
    "Conversion",
    "ConversionRegistry",
    "register_conversion",
    "register_builtin_conversions",
]
