"""What the step caches need to know about a denoiser's blocks and attention modules, taken from
diffusers' registries and from the declarations of the zoo's classes.

diffusers' block-level hooks (First-Block-Cache, MagCache) find a block's tokens, text stream and
outputs through ``TransformerBlockRegistry``, keyed by the block's exact class. The diffusers
families' blocks are registered there by diffusers; the zoo's blocks declare ``cache_streams``, the
names of their forward arguments holding the tokens and, for a two-stream block, the text (it then
returns both, tokens first), and are registered from that declaration (``block_metadata``). A
subclass made by a module conversion (``converter.class_swap``) takes its base class's entry.

Attention modules are classified for Pyramid Attention Broadcast by the zoo's declared
``attention_kind`` ("spatial", "temporal" or "cross"; ``attention_kinds``); a diffusers model's
attention is classified by diffusers' own ``apply_pyramid_attention_broadcast``.

TeaCache's signal, the timestep-modulated input of the first block, is model code: a zoo block
declares it as ``modulated_input(*forward args)``, a diffusers family in its step-cache piece
(``families/<family>/step_cache.py``: ``teacache_signal(block, args, kwargs)``; ``teacache_signal``).
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch.nn as nn
from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry

from ...errors import ConfigError
from ...families import family_of
from ...models.blocks import find_blocks


@dataclass
class DeclaredBlockMetadata(TransformerBlockMetadata):
    """diffusers' block metadata for a block whose arguments have other names than diffusers'
    ``hidden_states`` / ``encoder_hidden_states``: ``argument_names`` maps diffusers' name to the
    block's own."""

    argument_names: Dict[str, str] = field(default_factory=dict)

    def _get_parameter_from_args_kwargs(self, identifier: str, args=(), kwargs=None):
        return super()._get_parameter_from_args_kwargs(self.argument_names.get(identifier, identifier), args, kwargs)


def _registered(cls: type) -> Optional[TransformerBlockMetadata]:
    try:
        return TransformerBlockRegistry.get(cls)
    except ValueError:  # diffusers' answer for a class it does not know
        return None


def block_metadata(cls: type) -> Optional[TransformerBlockMetadata]:
    """diffusers' metadata for block class ``cls``, registering it first when the class declares
    ``cache_streams`` or a base class is registered; None when neither (the block cannot be hooked)."""
    found = _registered(cls)
    if found is not None:
        return found
    streams = getattr(cls, "cache_streams", None)
    if streams:
        tokens, *text = streams
        names = {"hidden_states": tokens, **({"encoder_hidden_states": text[0]} if text else {})}
        metadata = DeclaredBlockMetadata(return_hidden_states_index=0,
                                         return_encoder_hidden_states_index=1 if text else None,
                                         argument_names=names)
    else:
        base = next((_registered(b) for b in cls.__mro__[1:] if _registered(b) is not None), None)
        if base is None:
            return None
        metadata = DeclaredBlockMetadata(return_hidden_states_index=base.return_hidden_states_index,
                                         return_encoder_hidden_states_index=base.return_encoder_hidden_states_index,
                                         hidden_states_argument_name=base.hidden_states_argument_name,
                                         argument_names=dict(getattr(base, "argument_names", {})))
    TransformerBlockRegistry.register(model_class=cls, metadata=metadata)
    return metadata


def cache_blocks(model: nn.Module) -> List[nn.Module]:
    """The blocks the block-level caches hook as one stack, in forward order: a diffusers family's
    ``cache_block_lists`` when its step-cache piece declares them (the lists its tokens run through as
    one stream), else the model's blocks (``find_blocks``). A family that declares its blocks' streams
    (``block_streams``) has its block class registered for diffusers' hooks so."""
    family = family_of(model)
    spec = family.step_cache if family is not None else None
    blocks = [b for name in spec.cache_block_lists for b in model.get_submodule(name)] \
        if spec is not None and spec.cache_block_lists else find_blocks(model)
    if spec is not None and spec.block_streams:
        for cls in {type(b) for b in blocks}:
            _register_streams(cls, spec.block_streams)
    return blocks


def _register_streams(cls: type, streams: Tuple[str, ...]) -> None:
    """``cls``'s registry entry from its declared streams (tokens, [text]): the forward arguments the hooks
    read, returned in that order; replaces diffusers' entry, if any."""
    tokens, *text = streams
    names = {"hidden_states": tokens, **({"encoder_hidden_states": text[0]} if text else {})}
    found = _registered(cls)
    if isinstance(found, DeclaredBlockMetadata) and found.argument_names == names:
        return
    TransformerBlockRegistry.register(model_class=cls, metadata=DeclaredBlockMetadata(
        return_hidden_states_index=0, return_encoder_hidden_states_index=1 if text else None, argument_names=names))


def check_blocks(model: nn.Module, blocks: List[nn.Module], kind: str) -> None:
    """A ConfigError naming the block classes a block-level cache ``kind`` cannot hook."""
    unknown = sorted({type(b).__name__ for b in blocks if block_metadata(type(b)) is None})
    if unknown:
        raise ConfigError(f"sample.cache.kind={kind} cannot hook {type(model).__name__}: its blocks "
                          f"({', '.join(unknown)}) are neither in diffusers' TransformerBlockRegistry nor declare "
                          f"cache_streams (the forward arguments holding the tokens and the text), so the cache cannot "
                          f"tell which output to reuse. Use sample.cache.kind=none, or declare cache_streams on the "
                          f"block class.")


def attention_kinds(model: nn.Module) -> List[Tuple[str, nn.Module, str]]:
    """(name, module, kind) of every attention module of a zoo model that declares its ``attention_kind``."""
    return [(name, module, module.attention_kind) for name, module in model.named_modules()
            if isinstance(getattr(type(module), "attention_kind", None), str)]


def teacache_signal(model: nn.Module, head: nn.Module) -> Callable:
    """``signal(block, args, kwargs)``: the first block's timestep-modulated input, TeaCache's signal,
    for ``model``: a zoo model whose blocks declare ``modulated_input``, or a diffusers family whose
    step-cache piece declares it (``families/<family>/step_cache.py``). A ConfigError saying why
    when the model has none."""
    if callable(getattr(type(head), "modulated_input", None)):
        return lambda block, args, kwargs: block.modulated_input(*args, **kwargs)
    name, family = type(model).__name__, family_of(model)
    if family is None:
        raise ConfigError(f"sample.cache.kind=teacache cannot hook {name}: TeaCache decides from the first block's "
                          f"timestep-modulated input, which its block class ({type(head).__name__}) does not declare "
                          f"(modulated_input). Use sample.cache.kind=first_block or magcache.")
    spec = family.step_cache
    if spec.teacache_signal is None:
        raise ConfigError(f"sample.cache.kind=teacache cannot hook {name}: {spec.no_teacache} Use "
                          f"sample.cache.kind=first_block or magcache.")
    if spec.head_block not in {cls.__name__ for cls in type(head).__mro__}:
        raise ConfigError(f"sample.cache.kind=teacache cannot hook {name}: its TeaCache signal reads the arguments of "
                          f"a {spec.head_block}, but the first block is a {type(head).__name__}. Use "
                          f"sample.cache.kind=first_block or magcache.")
    return spec.teacache_signal
