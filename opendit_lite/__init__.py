"""opendit_lite: fast, cheap diffusion-transformer training on Colossal-AI.

The main entry points are imported lazily, so ``import opendit_lite`` stays cheap:
``parallelize`` (kernels -> sequence parallelism -> activation checkpointing -> compile, in that
order), ``parallelize_from_config`` (the same with a config's settings), ``ModuleConverter`` (the
kernel swaps it uses), ``OpenDiTPlugin`` (the booster plugin) and ``LiteGen`` (the
LiteGen-compatible facade).
"""

import importlib

from .utils.quiet import quiet_third_party_startup

__version__ = "0.1.0"

quiet_third_party_startup()  # before any submodule imports colossalai (--debug keeps its warnings)

_LAZY = {
    "parallelize": "opendit_lite.parallelization",
    "ParallelizeReport": "opendit_lite.parallelization",
    "parallelize_from_config": "opendit_lite.builders.parallelize",
    "ModuleConverter": "opendit_lite.converter",
    "OpenDiTPlugin": "opendit_lite.plugins",
    "LiteGen": "opendit_lite.litegen",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'opendit_lite' has no attribute {name!r}")


__all__ = list(_LAZY)
