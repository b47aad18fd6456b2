"""Which modules of a model are its repeated blocks: a capability a model may declare, detected
otherwise. Activation checkpointing and offload, per-block compile and sequence parallelism (which
shards the tokens at the block list of a model without split/gather markers) all work per block.

A diffusion transformer spends nearly all of its activation memory inside a stack of identical
blocks, so the blocks are the unit of activation checkpointing and offload (as they are of FSDP
wrapping, hence the method name a model may define to declare them: ``get_fsdp_wrap_module_list``).
A model that cannot define that method (another library's class, e.g. diffusers' Flux, whose double-
and single-stream blocks are two lists of one block each in a tiny config) has the attribute names
of its block lists declared instead, as the ``block_lists`` capability (``capabilities.py``).
Models that declare neither get their blocks detected: the repeated structure is the
``nn.ModuleList``/``nn.Sequential`` containers whose children all share one class, and the class
whose containers hold the most parameters wins. That finds DiT's ``blocks``, blocks nested in a
submodule (``model.transformer.blocks``), spatial and temporal lists of one block class (both are
returned), and blocks kept in an ``nn.Sequential``.
"""

from typing import Dict, List, Sequence, Type

import torch.nn as nn

from .capabilities import block_lists


def _is_callable_block(module: nn.Module) -> bool:
    """True for modules with a forward of their own; containers such as ModuleList have none."""
    return type(module).forward is not nn.Module.forward


def _declared_blocks(model: nn.Module) -> List[nn.Module]:
    """The blocks ``model.get_fsdp_wrap_module_list()`` returns, checked to be usable blocks."""
    owner = f"{type(model).__name__}.get_fsdp_wrap_module_list()"
    blocks = list(model.get_fsdp_wrap_module_list())
    if not blocks:
        raise ValueError(f"{owner} returned no modules; return the model's repeated blocks, or remove "
                         "the method so that the blocks are detected automatically.")
    return _checked_blocks(model, blocks, owner)


def _listed_blocks(model: nn.Module, names: Sequence[str]) -> List[nn.Module]:
    """The children of the model's declared block lists, list after list."""
    owner = f"{type(model).__name__}'s declared block_lists {tuple(names)}"
    blocks = []
    for name in names:
        container = getattr(model, name, None)
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            raise ValueError(f"{owner}: {type(model).__name__}.{name} is "
                             f"{type(container).__name__ if container is not None else 'missing'}, not an "
                             f"nn.ModuleList of blocks; fix the declaration (models/capabilities.py).")
        blocks += list(container)
    if not blocks:
        raise ValueError(f"{owner} hold no blocks.")
    return _checked_blocks(model, blocks, owner)


def _checked_blocks(model: nn.Module, blocks: List[nn.Module], owner: str) -> List[nn.Module]:
    """``blocks``, checked to be distinct, callable submodules of ``model``."""
    submodules = {id(m) for m in model.modules()}
    seen = set()
    for i, block in enumerate(blocks):
        if not isinstance(block, nn.Module):
            raise TypeError(f"{owner} must return a flat list of nn.Module blocks; item {i} is a "
                            f"{type(block).__name__}.")
        if not _is_callable_block(block):
            raise TypeError(f"{owner} must return a flat list of blocks; item {i} is a "
                            f"{type(block).__name__}, which is never called itself. Return its elements.")
        if id(block) not in submodules:
            raise ValueError(f"{owner}: item {i} ({type(block).__name__}) is not a submodule of the model.")
        if id(block) in seen:
            raise ValueError(f"{owner}: item {i} ({type(block).__name__}) is listed twice.")
        seen.add(id(block))
    return blocks


def _detected_blocks(model: nn.Module) -> List[nn.Module]:
    """Children of the same-class containers that hold the most parameters, in module order."""
    by_class: Dict[Type[nn.Module], Dict[int, nn.Module]] = {}  # block class -> blocks by id, ordered
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(container.children())
        if len(children) < 2:
            continue
        kind = type(children[0])
        if _is_callable_block(children[0]) and all(type(child) is kind for child in children):
            by_class.setdefault(kind, {}).update((id(child), child) for child in children)
    if not by_class:
        raise ValueError(
            f"{type(model).__name__} has no repeated blocks to checkpoint: no nn.ModuleList or nn.Sequential "
            "in it holds two or more modules of one class. Define get_fsdp_wrap_module_list() on the model "
            "to return its blocks, or leave activation checkpointing off."
        )

    def size(blocks: Dict[int, nn.Module]):
        # Parameter count first: a list of 28 transformer blocks must beat a list of 40 small
        # embedders. On a tie (blocks that merely wrap a list of inner blocks) prefer the finer split.
        params = {id(p): p.numel() for block in blocks.values() for p in block.parameters()}
        return sum(params.values()), len(blocks)

    return list(max(by_class.values(), key=size).values())


def find_blocks(model: nn.Module) -> List[nn.Module]:
    """The model's repeated blocks in order: ``model.get_fsdp_wrap_module_list()`` when the model
    defines it, else the children of its declared ``block_lists``, otherwise detected (see the
    module docstring). Raises ``ValueError`` when the
    model has no repeated structure and declares none.

    Detected blocks come in module order: for interleaved spatial and temporal lists, all spatial
    blocks then all temporal ones, so that activation checkpointing's ``select_blocks`` spreads the
    blocks it leaves out over both lists alike. A model that wants another order declares its blocks.
    """
    if callable(getattr(model, "get_fsdp_wrap_module_list", None)):
        return _declared_blocks(model)
    names = block_lists(model)
    if names is not None:
        return _listed_blocks(model, names)
    return _detected_blocks(model)


def blocks_source(model: nn.Module) -> str:
    """Where ``find_blocks`` takes the model's blocks from, for reports."""
    if callable(getattr(model, "get_fsdp_wrap_module_list", None)):
        return "get_fsdp_wrap_module_list()"
    names = block_lists(model)
    if names is not None:
        return f"declared block lists {', '.join(names)}"
    return f"detected {type(_detected_blocks(model)[0]).__name__} blocks"
