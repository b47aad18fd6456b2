"""What a model declares about itself, and the functions that read it.

The trainers, ``parallelize`` and the samplers never guess a capability from a model's name or by
catching the error a wrong call raises: they read these class attributes, with the defaults
below for models that do not declare them (a model we did not write):

* ``is_video`` (default False): the input is a clip [B, C, T, H, W] with a caption; False: an
  image [B, C, H, W] with a class label.
* ``supported_sp_modes`` (default ("ulysses", "ring", "usp"): every model whose attention follows the
  attention protocol runs them): the sequence-parallel modes it runs under: "ulysses" (attention heads
  all-to-all), "ring" (keys/values passed around the group), "usp" (Ulysses inside rings), "dsp"
  (re-shard at its ``SequenceSwitch`` markers). ``sp_mode: auto`` picks among all four (dsp given frames).
* ``guidance_layout`` (default None: no guided forward): the batch ``forward_with_cfg`` takes:
  "concat", [conditional; unconditional] 2B -> 2B (DiT); "paired", B -> B with the null
  condition added inside (STDiT, Vchitect).
* ``guidance_distilled`` (default False): the model takes the guidance scale as an input (distilled
  from classifier-free guidance, e.g. Flux-dev): it has no unconditional branch to run, so
  CFG-parallel sampling has nothing to split. A wrapper may declare it per instance (a property:
  ``FamilyDenoiser`` reads its config's ``guidance_embeds``).
* ``supports_gradient_checkpointing`` (default True): its blocks may be checkpointed.
* ``condition_dropout_kwarg`` (default None): the ``forward`` keyword taking a [B] bool tensor that
  marks the samples whose condition (class label, caption) is replaced by the null condition. The
  trainers then draw each sample's dropout from that sample's own stream, so a run does not depend
  on the rank layout; None: the model drops conditions itself, from each rank's global RNG.
* ``get_fsdp_wrap_module_list()`` (default: detected, see ``blocks.py``):
  its repeated blocks, the unit of activation checkpointing, offload and per-block compile;
* ``block_lists`` (default None): the names of the ``nn.ModuleList`` attributes holding those
  blocks, in the order the forward runs them (``("transformer_blocks", "single_transformer_blocks")``),
  for a model that does not define ``get_fsdp_wrap_module_list``;
* ``lora_targets`` (default ``DEFAULT_LORA_TARGETS``, the zoo's attention and MLP layers): the
  linear layers LoRA adapts when the config names none (see ``models/lora.py``).

A class of another library (diffusers' transformers) cannot carry these attributes, so they are
declared for it by name with ``declare_capabilities("module.ClassName", ...)`` (the diffusers
families trained today declare theirs when ``opendit_lite.families`` registers them), which imports
nothing. A reader takes the
class's own attribute first, then a declaration for the class or one of its bases, then the default.

Each reader takes a model instance or its class, so a capability can be checked from the
registry (``registered_class(name)``) before the model is built.
"""

from typing import Any, Dict, Optional, Tuple, Union

import torch.nn as nn

from ..config.schema import SP_MODES
from ..errors import ConfigError

GUIDANCE_LAYOUTS = ("concat", "paired")

# The zoo's attention and MLP linear layers (DiT, STDiT and Vchitect name them alike).
DEFAULT_LORA_TARGETS = ("qkv", "proj", "fc1", "fc2")

CAPABILITIES = ("is_video", "supported_sp_modes", "guidance_layout", "guidance_distilled",
                "supports_gradient_checkpointing", "condition_dropout_kwarg", "block_lists", "lora_targets",
                "unused_parameters")

ModelOrClass = Union[nn.Module, type]

# "module.QualName" of a class we did not write -> its declared capabilities.
_DECLARED: Dict[str, Dict[str, Any]] = {}


def declare_capabilities(class_path: str, **capabilities: Any) -> None:
    """Declare capabilities (names in ``CAPABILITIES``) for the class ``class_path``
    ("package.module.ClassName", as ``cls.__module__ + "." + cls.__qualname__``), a class of another
    library that cannot declare them itself. Several calls for one class add up; declaring one
    capability twice is an error."""
    unknown = sorted(set(capabilities) - set(CAPABILITIES))
    if unknown:
        raise ValueError(f"declare_capabilities({class_path!r}): unknown capabilities {unknown}; "
                         f"known: {', '.join(CAPABILITIES)}")
    declared = _DECLARED.setdefault(class_path, {})
    again = sorted(set(capabilities) & set(declared))
    if again:
        raise ValueError(f"declare_capabilities({class_path!r}): {again} already declared as "
                         f"{ {k: declared[k] for k in again} }")
    declared.update(capabilities)


def declared_capabilities(class_path: str) -> Dict[str, Any]:
    """What ``declare_capabilities`` holds for ``class_path`` (a copy; empty when nothing is declared)."""
    return dict(_DECLARED.get(class_path, {}))


def _cls(model: ModelOrClass) -> type:
    return model if isinstance(model, type) else type(model)


def _capability(model: ModelOrClass, name: str, default: Any) -> Any:
    """The class's own attribute ``name``, else a declaration for it or a base class, else ``default``."""
    cls = _cls(model)
    if hasattr(cls, name):
        return getattr(cls, name)
    for base in cls.__mro__:
        declared = _DECLARED.get(f"{base.__module__}.{base.__qualname__}", {})
        if name in declared:
            return declared[name]
    return default


def is_video_model(model: ModelOrClass) -> bool:
    """True when the model declares ``is_video = True`` (clips and captions in)."""
    return bool(_capability(model, "is_video", False))


def model_family(name: str) -> str:
    """"video" or "image" for a registered model name, from its declared class (before building it)."""
    from .registry import registered_class

    cls = registered_class(name)
    return "video" if cls is not None and is_video_model(cls) else "image"


DEFAULT_SP_MODES = ("ulysses", "ring", "usp")
AUTO_SP_MODES = ("ulysses", "dsp", "usp", "ring")  # what sp_mode=auto chooses among (dsp given frames)


def supported_sp_modes(model: ModelOrClass) -> Tuple[str, ...]:
    """The sequence-parallel modes the model declares (default: ulysses, ring and usp)."""
    modes = tuple(_capability(model, "supported_sp_modes", DEFAULT_SP_MODES))
    unknown = [m for m in modes if m not in SP_MODES]
    if unknown:
        raise ValueError(f"{_cls(model).__qualname__}.supported_sp_modes lists {unknown}; known modes: {SP_MODES}")
    return modes


def check_sp_mode(model: ModelOrClass, sp_mode: str, modes: Optional[Tuple[str, ...]] = None) -> None:
    """A ConfigError unless ``sp_mode`` is one of the model's ``supported_sp_modes`` (``modes`` when
    given: what a registry declares for a class we did not write); "auto" needs one of ulysses, ring, usp."""
    if sp_mode not in SP_MODES + ("auto",):
        raise ConfigError(f"sp_mode={sp_mode!r} is not one of {', '.join(SP_MODES + ('auto',))}.")
    modes = supported_sp_modes(model) if modes is None else tuple(modes)
    name = _cls(model).__name__
    if sp_mode == "auto":
        if not any(m in modes for m in AUTO_SP_MODES):
            raise ConfigError(f"sp_mode=auto chooses among {', '.join(AUTO_SP_MODES)}, but {name} declares "
                              f"supported_sp_modes={modes}; "
                              + (f"use sp_mode={modes[0]}." if modes else "train it with sp_size=1."))
        return
    if sp_mode not in modes:
        raise ConfigError(f"sp_mode={sp_mode} is not supported by {name} (it declares supported_sp_modes={modes}); "
                          + (f"use sp_mode={modes[0]}." if modes else "train it with sp_size=1."))


def guidance_layout(model: ModelOrClass) -> Optional[str]:
    """How the model's ``forward_with_cfg`` lays out its batch: "concat", "paired", or None when the
    model declares no guided forward."""
    layout = _capability(model, "guidance_layout", None)
    if layout is not None and layout not in GUIDANCE_LAYOUTS:
        raise ValueError(f"{_cls(model).__qualname__}.guidance_layout is {layout!r}; "
                         f"expected one of {GUIDANCE_LAYOUTS}")
    return layout


def guidance_distilled(model: ModelOrClass) -> bool:
    """True when the model declares it takes the guidance scale as an input (no unconditional branch);
    an instance's own value (a property) wins over its class's declaration."""
    if not isinstance(model, type):
        value = getattr(model, "guidance_distilled", None)
        if isinstance(value, bool):
            return value
    value = _capability(model, "guidance_distilled", False)
    return value if isinstance(value, bool) else False


def supports_gradient_checkpointing(model: ModelOrClass) -> bool:
    """False only when the model declares ``supports_gradient_checkpointing = False``."""
    return bool(_capability(model, "supports_gradient_checkpointing", True))


def condition_dropout_kwarg(model: ModelOrClass) -> Optional[str]:
    """The forward keyword through which the trainer sets condition dropout, or None (see above)."""
    return _capability(model, "condition_dropout_kwarg", None)


def block_lists(model: ModelOrClass) -> Optional[Tuple[str, ...]]:
    """The declared names of the model's block lists (``nn.ModuleList`` attributes), or None."""
    names = _capability(model, "block_lists", None)
    if names is None:
        return None
    if isinstance(names, str) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{_cls(model).__qualname__}: block_lists must be a non-empty tuple of attribute names, "
                         f"got {names!r}")
    return tuple(names)


def lora_targets(model: ModelOrClass) -> Tuple[str, ...]:
    """The linear layers LoRA adapts by default in this model (``lora_target_names`` patterns)."""
    return tuple(_capability(model, "lora_targets", DEFAULT_LORA_TARGETS))


def unused_parameters(model: nn.Module) -> Tuple[str, ...]:
    """The names of the model's parameters that nothing it returns depends on (declared as a function of
    the model: Qwen-Image's last block's text-stream outputs), which training freezes: DDP and ZeRO's
    bucketed reductions expect a gradient for every trainable parameter."""
    find = _capability(model, "unused_parameters", None)
    return tuple(find(model)) if find is not None else ()
