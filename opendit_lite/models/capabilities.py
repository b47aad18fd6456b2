"""What a model declares about itself, and the functions that read it.

The trainers, ``parallelize`` and the samplers never guess a capability from a model's name or by
catching the error a wrong call raises: they read these class attributes, with the defaults
below for models that do not declare them (a model we did not write):

* ``is_video`` (default False): the input is a clip [B, C, T, H, W] with a caption; False: an
  image [B, C, H, W] with a class label.
* ``supported_sp_modes`` (default ("ulysses",)): the sequence-parallel modes it runs under:
  "ulysses" (attention heads all-to-all), "dsp" (re-shard at its ``SequenceSwitch`` markers).
* ``guidance_layout`` (default None: no guided forward): the batch ``forward_with_cfg`` takes:
  "concat", [conditional; unconditional] 2B -> 2B (DiT); "paired", B -> B with the null
  condition added inside (STDiT, Vchitect).
* ``supports_gradient_checkpointing`` (default True): its blocks may be checkpointed.
* ``condition_dropout_kwarg`` (default None): the ``forward`` keyword taking a [B] bool tensor that
  marks the samples whose condition (class label, caption) is replaced by the null condition. The
  trainers then draw each sample's dropout from that sample's own stream, so a run does not depend
  on the rank layout; None: the model drops conditions itself, from each rank's global RNG.
* ``get_fsdp_wrap_module_list()`` (default: detected, see ``blocks.py``):
  its repeated blocks, the unit of activation checkpointing, offload and per-block compile.

Each reader takes a model instance or its class, so a capability can be checked from the
registry (``registered_class(name)``) before the model is built.
"""

from typing import Optional, Tuple, Union

import torch.nn as nn

from ..config.schema import SP_MODES
from ..errors import ConfigError

GUIDANCE_LAYOUTS = ("concat", "paired")

ModelOrClass = Union[nn.Module, type]


def _cls(model: ModelOrClass) -> type:
    return model if isinstance(model, type) else type(model)


def is_video_model(model: ModelOrClass) -> bool:
    """True when the model declares ``is_video = True`` (clips and captions in)."""
    return bool(getattr(_cls(model), "is_video", False))


def model_family(name: str) -> str:
    """"video" or "image" for a registered model name, from its declared class (before building it)."""
    from .registry import registered_class

    cls = registered_class(name)
    return "video" if cls is not None and is_video_model(cls) else "image"


def supported_sp_modes(model: ModelOrClass) -> Tuple[str, ...]:
    """The sequence-parallel modes the model declares (default: Ulysses only)."""
    modes = tuple(getattr(_cls(model), "supported_sp_modes", ("ulysses",)))
    unknown = [m for m in modes if m not in SP_MODES]
    if unknown:
        raise ValueError(f"{_cls(model).__qualname__}.supported_sp_modes lists {unknown}; known modes: {SP_MODES}")
    return modes


def check_sp_mode(model: ModelOrClass, sp_mode: str) -> None:
    """A ConfigError unless the model declares ``sp_mode`` in its ``supported_sp_modes``."""
    if sp_mode not in SP_MODES:
        raise ConfigError(f"sp_mode={sp_mode!r} is not one of {', '.join(SP_MODES)}.")
    modes = supported_sp_modes(model)
    if sp_mode not in modes:
        name = _cls(model).__name__
        raise ConfigError(f"sp_mode={sp_mode} is not supported by {name} (it declares supported_sp_modes={modes}); "
                          + (f"use sp_mode={modes[0]}." if modes else "train it with sp_size=1."))


def guidance_layout(model: ModelOrClass) -> Optional[str]:
    """How the model's ``forward_with_cfg`` lays out its batch: "concat", "paired", or None when the
    model declares no guided forward."""
    layout = getattr(_cls(model), "guidance_layout", None)
    if layout is not None and layout not in GUIDANCE_LAYOUTS:
        raise ValueError(f"{_cls(model).__qualname__}.guidance_layout is {layout!r}; "
                         f"expected one of {GUIDANCE_LAYOUTS}")
    return layout


def supports_gradient_checkpointing(model: ModelOrClass) -> bool:
    """False only when the model declares ``supports_gradient_checkpointing = False``."""
    return bool(getattr(_cls(model), "supports_gradient_checkpointing", True))


def condition_dropout_kwarg(model: ModelOrClass) -> Optional[str]:
    """The forward keyword through which the trainer sets condition dropout, or None (see above)."""
    return getattr(_cls(model), "condition_dropout_kwarg", None)
