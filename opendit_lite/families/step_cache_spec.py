"""The step-cache piece of a family (``<family>/step_cache.py``): what sampling's step caches
(``sampling/cache/``) need to know about a family that diffusers' cache hooks do not say.

diffusers' hooks find everything else themselves: the block-level caches (First-Block-Cache,
MagCache) hook the family's ``block_lists`` as one stack, in forward order (the first block of the
first list is the head, the last block of the last list the tail: HunyuanVideo's and Flux's double-
then single-stream blocks), and read each block's tokens and text stream from diffusers'
``TransformerBlockRegistry``; Pyramid Attention Broadcast classifies the attention modules by name.

TeaCache (Liu et al., 2024) decides from a model-specific tensor: the first block's input as its
attention reads it, normalised and modulated by the timestep embedding. That is model code, so each
family declares it here as ``teacache_signal(block, args, kwargs) -> [B, N, D]``, computed from the
arguments the head block is called with (the block's own norms and modulation, nothing run twice
but the one norm), or, where a family has no such tensor, ``None`` with the reason in
``no_teacache``. ``head_block`` names the block class whose forward arguments the signal reads. A
family whose blocks no cache can hook (diffusers' hooks cannot follow their streams) says why in
``no_cache``: every ``sample.cache.kind`` is then refused with that reason.

A family whose block lists are not all one stream (Z-Image's refiners run the image tokens and the
caption apart before its main layers run them joined) names the lists the block-level caches hook in
``cache_block_lists`` (the others run at every step, as HunyuanVideo's token refiner does). Where
diffusers' ``TransformerBlockRegistry`` has no entry for the family's block class (HunyuanVideo 1.5's)
or a wrong one (Z-Image's reads ``hidden_states``, its block takes ``x``), ``block_streams`` names the
block's forward arguments holding its tokens and, for a two-stream block, its text (returned in that
order), as the zoo's blocks declare ``cache_streams``; the caches register the block class so.
"""

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn

# (the head block, its forward's positional args, its keyword args) -> the signal [B, N, D]
Signal = Callable[[nn.Module, tuple, dict], torch.Tensor]


@dataclass(frozen=True)
class StepCacheSpec:
    """A family's step-cache piece (see the module docstring)."""

    family: str                          # the family's name, as in its record
    head_block: str                      # the diffusers class of the first block (whose arguments the signal reads)
    teacache_signal: Optional[Signal]    # the first block's timestep-modulated input; None: no TeaCache
    no_teacache: str = ""                # why the family has no TeaCache signal (when teacache_signal is None)
    no_cache: str = ""                   # why no step cache hooks the family's blocks (every kind refused)
    cache_block_lists: Tuple[str, ...] = ()  # the block lists the block-level caches hook (empty: block_lists)
    block_streams: Tuple[str, ...] = ()  # the blocks' (tokens, text) arguments, returned so: where diffusers' misses


def forward_arguments(block: nn.Module, args: tuple, kwargs: dict) -> Dict[str, Any]:
    """The arguments of a call ``block(*args, **kwargs)`` by the names of its class's ``forward``."""
    return inspect.signature(type(block).forward).bind(block, *args, **(kwargs or {})).arguments


def ada_norm_zero_signal(block: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """The tokens a block with diffusers' ``AdaLayerNormZero`` as ``norm1`` feeds its attention:
    ``norm1(hidden_states, emb=temb)``'s first output (Flux, SD3 and HunyuanVideo's double-stream
    blocks; SD3.5's dual-attention norm returns it first too). [B, N, D]."""
    inputs = forward_arguments(block, args, kwargs)
    return block.norm1(inputs["hidden_states"], emb=inputs["temb"])[0]
