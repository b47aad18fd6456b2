"""The module converter: swap model submodules for fused kernels or other attention backends,
chosen by explicit keywords, without touching model code.

    from opendit_lite import ModuleConverter
    report = ModuleConverter(fused_adaln=True, attention_backend="auto").convert(model)   # in place
    print(report)

Register a conversion for your own module type with ``register_conversion`` (see ``registry.py``
for the factory signature and the order conversions run in). Importing this package registers the
built-in conversions (``builtin.py``), fused AdaLN for blocks of Meta's DiT and diffusers and for
blocks following the ``adaln_norms`` protocol (``adaln_protocol.py``, ``meta_dit.py``,
``diffusers_blocks.py``; diffusers' adaptive norm modules, ``diffusers_norms.py``), and the adapters
giving timm's and diffusers' attention an ``attn_op`` (``attention_adapters.py``, using
``opendit_lite.parallel.foreign_attention``). The block swaps of the diffusers families trained today
(Wan, Flux, SD3, CogVideoX, HunyuanVideo, LTX-Video) are theirs (``opendit_lite/families/<family>/
fused_norms.py``), registered here through ``diffusers_family_blocks.register_fused_norms`` when
``opendit_lite.families`` is imported. Sequence parallelism is not a conversion:
``opendit_lite.parallelization.parallelize`` applies it with ``opendit_lite.parallel``.
"""

# Importing these registers the conversions: the built-ins, fused AdaLN for foreign blocks (and the
# families of Meta's DiT and diffusers), and the timm / diffusers attention adapters.
from . import diffusers_blocks as _diffusers_blocks  # noqa: F401
from . import diffusers_norms as _diffusers_norms  # noqa: F401
from . import meta_dit as _meta_dit  # noqa: F401
from .adaln_protocol import (
    AdaLNLayerNorm,
    AdaLNModelNotes,
    adaln_model_notes,
    norm_modulate,
    register_adaln_block,
    register_adaln_model,
    residual_norm_modulate,
)
from .attention_adapters import register_attention_adapters
from .builtin import register_builtin_conversions
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
    "AdaLNModelNotes",
    "adaln_model_notes",
    "norm_modulate",
    "register_adaln_block",
    "register_adaln_model",
    "residual_norm_modulate",
    "register_attention_adapters",
]
