"""The module converter: swap model submodules for fused kernels or other attention backends,
chosen by explicit keywords, without touching model code.

    from opendit_lite import ModuleConverter
    report = ModuleConverter(fused_adaln=True, attention_backend="auto").convert(model)   # in place
    print(report)

Register a conversion for your own module type with ``register_conversion`` (see ``registry.py``
for the factory signature and the order conversions run in). Importing this package registers the
built-in conversions (``builtin.py``), fused AdaLN for blocks of Meta's DiT and diffusers and for
blocks following the ``adaln_norms`` protocol (``adaln_protocol.py``, ``meta_dit.py``,
``diffusers_blocks.py``), and the adapters giving timm's and diffusers' attention an ``attn_op``
(``attention_adapters.py``, using ``opendit_lite.parallel.foreign``). Sequence parallelism is not a conversion:
``opendit_lite.transforms.parallelize`` applies it with ``opendit_lite.parallel``.
"""

from .converter import ConversionReport, ConversionSection, ModuleConverter, Replacement
from .registry import (
    CONVERSIONS,
    PRIORITY_ADAPTER,
    PRIORITY_BACKEND,
    PRIORITY_WRAPPER,
    Conversion,
    ConversionRegistry,
    ConverterOptions,
    register_conversion,
)
from .builtin import register_builtin_conversions  # noqa: E402  (registers the built-ins)
from .adaln_protocol import AdaLNLayerNorm, norm_modulate, register_adaln_block  # noqa: E402  (fused AdaLN, foreign blocks)
from . import diffusers_blocks as _diffusers_blocks, meta_dit as _meta_dit  # noqa: E402,F401  (register their families)
from .attention_adapters import register_attention_adapters  # noqa: E402  (timm and diffusers attention)

__all__ = [
    "ModuleConverter",
    "ConversionReport",
    "ConversionSection",
    "ConverterOptions",
    "Replacement",
    "CONVERSIONS",
    "PRIORITY_ADAPTER",
    "PRIORITY_BACKEND",
    "PRIORITY_WRAPPER",
    "Conversion",
    "ConversionRegistry",
    "register_conversion",
    "register_builtin_conversions",
    "AdaLNLayerNorm",
    "norm_modulate",
    "register_adaln_block",
]
