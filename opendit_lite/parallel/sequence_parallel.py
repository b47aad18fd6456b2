"""Turn a serial model into a sequence-parallel one in place: ``apply_sequence_parallel(model, group)``.

Three swaps, all around one ``SequenceParallelState``, and no change to model code:

* ``SequenceSplit`` markers -> ``SequenceParallelSplit`` (keep this rank's shard, pad if needed);
* ``SequenceGather`` markers -> ``SequenceParallelGather`` (all-gather, drop the padding);
* the ``attn_op`` of every attention module -> its sequence-parallel op, chosen by the attention
  module's type from a small registry: ``Attention`` (self-attention over the token sequence)
  gets ``UlyssesAttentionOp``. The role is keyed by the owning module rather than by the op's
  class because the op's class names the backend (SDPA, flash-attn, ...), which the backend
  conversion may already have changed, while the module says what the op attends over.

Video models that attend along an axis that is not sharded (temporal attention when the spatial
tokens are sharded) register their module type with ``None`` to keep its op serial, and
cross-attention modules register ``SequenceParallelCrossAttentionOp``. An attention op whose module
type was not registered is an error rather than a silent serial op that would attend to a shard.

Models written outside the zoo: timm's and diffusers' attention modules first get an ``attn_op``
(``foreign.py``); a module that declares ``sequence_parallel_attention`` ("self", "cross" or
"serial") needs no registration; a model without markers is split at its first block's input and
gathered at its last block's output (``boundaries.py``), and then every block must hold an
attention op this module can run.

Run it after the backend conversion (the Ulysses op wraps whatever op it finds) and before
activation checkpointing and data-parallel wrapping, which only see the finished modules.
``opendit_lite.transforms.parallelize`` calls it (``sp_mode="ulysses"``) in that place of its order.
See ``comm.py`` for the gradient convention: DDP/ZeRO's world mean of gradients is exact;
docs/sequence_parallel.md for usage and communication volume. """

from typing import Callable, Dict, Optional

import torch.distributed as dist
import torch.nn as nn

from opendit_lite.models.blocks import find_blocks
from opendit_lite.models.layers.attention import Attention, AttentionOp
from opendit_lite.models.layers.sequence import SequenceGather, SequenceSplit

from .boundaries import place_sequence_boundaries
from .foreign import PROTOCOL, adapt_foreign_attention, declared_role
from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState
from .ulysses import SequenceParallelCrossAttentionOp, SequenceParallelOp, UlyssesAttentionOp

SPOpFactory = Callable[[AttentionOp, SequenceParallelState], SequenceParallelOp]

# Attention module type -> factory of the SP op wrapping its ``attn_op`` (None: keep it serial).
# Filled by ``register_sequence_parallel_attention``; ``Attention`` -> ``UlyssesAttentionOp`` is
# built in (below), the video models' types are registered in ``dsp.py``.
SEQUENCE_PARALLEL_ATTENTION: Dict[type, Optional[SPOpFactory]] = {}


def register_sequence_parallel_attention(module_type: type, op_factory: Optional[SPOpFactory]) -> None:
    """Declare how the ``attn_op`` of ``module_type`` modules runs under sequence parallelism.

    ``op_factory(inner_op, state)`` builds the ``SequenceParallelOp`` that replaces it (e.g.
    ``UlyssesAttentionOp`` for self-attention over the tokens, ``SequenceParallelCrossAttentionOp``
    for attention to a replicated context); None keeps it serial (attention along an axis that is
    not sharded). Subclasses follow their nearest registered base. A duplicate is an error.
    """
    if module_type in SEQUENCE_PARALLEL_ATTENTION:
        raise ValueError(f"{module_type.__qualname__} already has a sequence-parallel attention entry "
                         f"({SEQUENCE_PARALLEL_ATTENTION[module_type]!r})")
    SEQUENCE_PARALLEL_ATTENTION[module_type] = op_factory


# The op factory for each role an attention module can declare (the protocol in foreign.py).
_ROLE_FACTORIES: Dict[str, Optional[SPOpFactory]] = {
    "self": UlyssesAttentionOp,
    "cross": SequenceParallelCrossAttentionOp,
    "serial": None,
}


def _entry(module: nn.Module):
    """(registered, factory) for ``module``: its type's entry, looked up along its MRO, else the
    role its class declares with ``sequence_parallel_attention``."""
    for cls in type(module).__mro__:
        if cls in SEQUENCE_PARALLEL_ATTENTION:
            return True, SEQUENCE_PARALLEL_ATTENTION[cls]
    role = declared_role(module)
    if role is not None:
        return True, _ROLE_FACTORIES[role]
    return False, None


def convert_attention_module(module: nn.Module, state: SequenceParallelState) -> nn.Module:
    """Wrap ``module.attn_op`` as its registered SP op (in place; returns ``module``). An op that
    is already sequence-parallel is left alone, so a module matched twice is wrapped once."""
    registered, factory = _entry(module)
    if not registered:
        raise TypeError(f"{type(module).__qualname__} has no sequence-parallel attention entry; "
                        f"call register_sequence_parallel_attention for it")
    if factory is None or isinstance(module.attn_op, SequenceParallelOp):
        return module
    op = factory(module.attn_op, state)
    if not isinstance(op, SequenceParallelOp):
        raise TypeError(f"the sequence-parallel factory for {type(module).__qualname__} returned "
                        f"{type(op).__qualname__}; it must return a SequenceParallelOp")
    module.attn_op = op
    return module


def convert_sequence_marker(module: nn.Module, state: SequenceParallelState) -> nn.Module:
    """The SP module replacing a ``SequenceSplit`` or ``SequenceGather`` marker."""
    if isinstance(module, SequenceSplit):
        return SequenceParallelSplit(state, dim=module.dim)
    if isinstance(module, SequenceGather):
        return SequenceParallelGather(state, dim=module.dim)
    raise TypeError(f"expected a SequenceSplit or SequenceGather marker, got {type(module).__qualname__}")


def _check_blocks_attend(blocks, attention) -> None:
    """Every block must hold an attention op that sequence parallelism knows, or its attention (of
    a class we cannot see into) would attend within a shard."""
    owners = {id(m) for m in attention}
    for index, block in enumerate(blocks):
        if not any(id(m) in owners for m in block.modules()):
            kinds = sorted({type(m).__qualname__ for m in block.modules() if m is not block
                            and not isinstance(m, (nn.Linear, nn.LayerNorm, nn.Dropout, nn.Identity, nn.Sequential,
                                                   nn.ModuleList, nn.SiLU, nn.GELU))})
            raise TypeError(
                f"block {index} ({type(block).__qualname__}) has no attention module that sequence parallelism "
                f"can run (its submodules: {', '.join(kinds) or 'none'}); with sp_size > 1 its attention would "
                f"see only this rank's shard of the tokens. Make its attention class follow the attention "
                f"protocol: {PROTOCOL}"
            )


def apply_sequence_parallel(model: nn.Module, sp_group: Optional[dist.ProcessGroup]) -> nn.Module:
    """Make ``model`` sequence-parallel over ``sp_group`` in place and return it.

    A group of one rank leaves the model untouched. Attention modules of timm and diffusers get an
    ``attn_op`` first (``foreign.py``). A model with ``SequenceSplit``/``SequenceGather`` markers is
    sharded there; a model without them at its block list (``boundaries.py``), in which case
    every block must hold an attention op sequence parallelism knows. Raises if the model is
    already sequence-parallel, holds an attention op under a module type with no
    sequence-parallel entry, or has neither markers nor a block list.
    """
    state = SequenceParallelState(sp_group)
    if state.size == 1:
        return model
    if any(isinstance(m, (SequenceParallelSplit, SequenceParallelGather)) for m in model.modules()):
        raise ValueError(f"{type(model).__qualname__} is already sequence-parallel")
    adapt_foreign_attention(model)
    # Plan on the (adapted) tree, check, then swap: a bad model is left without sequence parallelism.
    markers, attention, unregistered = [], [], []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            if isinstance(child, (SequenceSplit, SequenceGather)):
                markers.append((parent, child_name, child))
            elif isinstance(child, AttentionOp):
                if child_name == "attn_op" and _entry(parent)[0]:
                    attention.append(parent)
                else:
                    unregistered.append(f"{parent_name}.{child_name}".lstrip("."))
    if unregistered:
        raise TypeError(
            f"sequence parallelism does not know how to run the attention op(s) {unregistered}: "
            f"register the type of the module holding each as ``attn_op`` with "
            f"register_sequence_parallel_attention (None keeps an op serial, e.g. attention along "
            f"an axis that is not sharded), or declare it on the class: {PROTOCOL}"
        )
    splits = sum(isinstance(m, SequenceSplit) for _, _, m in markers)
    gathers = len(markers) - splits
    blocks = None
    if not markers:
        try:
            blocks = find_blocks(model)
        except ValueError as e:
            raise ValueError(
                f"{type(model).__qualname__} has no SequenceSplit/SequenceGather markers and no block list to "
                f"shard the tokens at: {e}"
            ) from None
        _check_blocks_attend(blocks, attention)
    elif not splits or not gathers:
        raise ValueError(
            f"{type(model).__qualname__} has {splits} SequenceSplit and {gathers} SequenceGather "
            f"markers; sequence parallelism needs the model to pass its tokens through both "
            f"(after the embeddings and before the final layer)"
        )
    for module in attention:
        convert_attention_module(module, state)
    if blocks is not None:
        place_sequence_boundaries(model, blocks, state)
    for parent, name, marker in markers:
        parent.register_module(name, convert_sequence_marker(marker, state))
    return model


register_sequence_parallel_attention(Attention, UlyssesAttentionOp)
