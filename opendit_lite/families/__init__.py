"""The diffusers families trained today (Wan, HunyuanVideo, CogVideoX, LTX-Video, Flux, SD3): one
folder per family (``opendit_lite/families/<family>/``) holding everything specific to it, found
through one registry (``registry.py``). ``load_families()``, or the first other name read from
this package, registers the six families (``FAMILY_FOLDERS``) and fans their pieces out to the
mechanisms that look them up (capabilities, sequence parallelism, fused AdaLN); every entry point
that builds, parallelizes, plans or samples a model reads it.

``FamilyDenoiser`` wraps a model with its family's adapter into the ``(x, t, y, mask)`` denoiser
every objective and sampler calls. Adding a family: ``docs/adding_a_family.md``.

Training recipes (objective, training-time distribution, shift), as each family's release trains
and samples (each in its ``<family>/adapter.py``):

| family | objective | times | shift |
|---|---|---|---|
| Wan 2.x | flow matching | uniform | 5 |
| HunyuanVideo | flow matching | uniform | 7 |
| LTX-Video | flow matching | logit-normal | by token count: e^0.95 at 1024 tokens .. e^2.05 at 4096 |
| SD3 / SD3.5 | flow matching | logit-normal | 3 |
| Flux | flow matching | logit-normal | by token count: e^0.5 at 256 tokens .. e^1.15 at 4096 |
| CogVideoX | v-prediction, DDPM schedule | uniform steps | SNR shift 1 (the 5B and 1.5 models) |

Nothing here imports diffusers at import time: an adapter reads the model's config (a mapping) and
calls the model; the other pieces name diffusers' classes. Nor torch: the names below are imported
on first use, and the first use registers the six families, so that a script can read a module of
this package (``tiny_pipelines.FAMILIES``) before it imports torch.
"""

import importlib

FAMILY_FOLDERS = ("cogvideox", "flux", "hunyuan_video", "ltx_video", "sd3", "wan")

_LAZY = {
    **{name: "adapter_base" for name in ("FamilyAdapter", "Recipe")},
    "FamilyDenoiser": "family_denoiser",
    **{name: "registry" for name in ("FAMILIES", "Family", "family_adapter", "family_class_names", "family_of",
                                     "find_family", "is_family", "register_family", "unregistered_pieces")},
}


def load_families() -> dict:
    """Import the six family folders, each registering its family on its first import; returns the
    registry (name -> ``Family``). Reading any other name of this package calls it."""
    for folder in FAMILY_FOLDERS:
        importlib.import_module(f"{__name__}.{folder}")
    return importlib.import_module(f"{__name__}.registry").FAMILIES


def __getattr__(name):
    if name in _LAZY:
        load_families()
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted([*_LAZY, "FAMILY_FOLDERS", "load_families"])
