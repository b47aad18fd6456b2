"""The family adapter protocol and its registry, keyed by the diffusers class name
(``"WanTransformer3DModel"``): ``register_family`` adds one (a duplicate is an error),
``family_adapter(name_or_model)`` finds it.

An adapter maps the project's clip batch (x [B, C, T, H, W], caption states [B, M, W] with their
bool mask [B, M], pooled text [B, P], the objective's timestep [B]) onto the model's own forward
keywords and its output back to [B, C, T, H, W]; it reads the model's diffusers config (a mapping:
``model.config`` or the dict a model is built from), never the class.
"""

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn


@dataclass(frozen=True)
class Recipe:
    """A family's published training objective: ``objective`` "rflow" (flow matching, times shifted
    by ``shift``) or "vpred" (v-prediction, SNR divided by ``shift``), with training times drawn by
    ``timestep_sampling`` ("uniform" or "logit-normal")."""

    objective: str
    timestep_sampling: str
    shift: float


class FamilyAdapter:
    """One diffusers family. Subclasses set the class attributes and implement ``forward``.

    * ``class_name``: the diffusers class (``model.name`` in a config);
    * ``text_width_key`` / ``pooled_width_key``: the config keys of the caption-state width and of
      the pooled text vector's width (None: the model takes no pooled text);
    * ``image_only``: an image model, trained on 1-frame clips;
    * ``modulated_input``: None, or ``(block, args, kwargs) -> tensor``, the timestep-modulated input
      of a block called with ``args``/``kwargs`` (TeaCache's signal when sampling with a step cache).
    """

    class_name: str = ""
    text_width_key: str = ""
    pooled_width_key: Optional[str] = None
    image_only: bool = False
    modulated_input = None

    def guidance_distilled(self, config: Mapping) -> bool:
        """True when a model of this config takes the guidance scale as an input (distilled from
        classifier-free guidance): it has no unconditional branch of its own to run."""
        return False

    def recipe(self, config: Mapping, tokens: int) -> Recipe:
        """The training recipe for clips of ``tokens`` patches (Flux and LTX-Video shift by it)."""
        raise NotImplementedError

    def patch_size(self, config: Mapping) -> Tuple[int, int, int]:
        """(pt, ph, pw): latent frames, rows and columns per token."""
        raise NotImplementedError

    def latent_channels(self, config: Mapping) -> int:
        """Channels of the clips the model denoises (before any packing)."""
        return int(config["in_channels"])

    def text_width(self, config: Mapping) -> int:
        return int(config[self.text_width_key])

    def pooled_width(self, config: Mapping) -> Optional[int]:
        return int(config[self.pooled_width_key]) if self.pooled_width_key else None

    def forward(self, model: nn.Module, config: Mapping, x: torch.Tensor, t: torch.Tensor, states: torch.Tensor,
                mask: torch.Tensor, pooled: Optional[torch.Tensor]) -> torch.Tensor:
        """x [B, C, T, H, W], t [B] (the objective's timestep: flow time x 1000, or the integer
        DDPM step), states [B, M, W] (zero where masked), mask [B, M] bool, pooled [B, P] or None
        -> the prediction [B, C, T, H, W]."""
        raise NotImplementedError


FAMILY_ADAPTERS: Dict[str, FamilyAdapter] = {}


def register_family(adapter_cls: type) -> type:
    """Class decorator: register an instance of ``adapter_cls`` under its ``class_name``."""
    name = adapter_cls.class_name
    if name in FAMILY_ADAPTERS:
        raise ValueError(f"a family adapter for {name!r} is already registered "
                         f"({type(FAMILY_ADAPTERS[name]).__name__})")
    FAMILY_ADAPTERS[name] = adapter_cls()
    return adapter_cls


def is_family(name_or_model: Union[str, nn.Module, None]) -> bool:
    """True for a registered diffusers class name, or a model (or class) of one."""
    return _name(name_or_model) in FAMILY_ADAPTERS


def family_adapter(name_or_model: Union[str, nn.Module]) -> FamilyAdapter:
    """The adapter of a diffusers class name, or of a model (or class) of that class."""
    name = _name(name_or_model)
    if name not in FAMILY_ADAPTERS:
        raise KeyError(f"no family adapter for {name!r}; registered: {', '.join(sorted(FAMILY_ADAPTERS))}")
    return FAMILY_ADAPTERS[name]


def _name(name_or_model) -> Optional[str]:
    if name_or_model is None or isinstance(name_or_model, str):
        return name_or_model
    cls = name_or_model if isinstance(name_or_model, type) else type(name_or_model)
    return cls.__name__
