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

Run it after the backend conversion (the Ulysses op wraps whatever op it finds) and before
activation checkpointing and data-parallel wrapping, which only see the finished modules. ``opendit_lite.parallelize`` calls it
(``sp_mode="ulysses"``) in that place of its order. See ``comm.py`` for the gradient convention: DDP/ZeRO's world mean of gradients
is exact; docs/sequence_parallel.md for usage and communication volume.
"""

from typing import Callable, Dict, Optional

import torch.distributed as dist
import torch.nn as nn

from opendit_lite.models.layers.attention import Attention, AttentionOp
from opendit_lite.models.layers.sequence import SequenceGather, SequenceSplit

from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState
from .ulysses import SequenceParallelOp, UlyssesAttentionOp

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


def _entry(module: nn.Module):
    """(registered, factory) for ``module``'s type, looked up along its MRO."""
    for cls in type(module).__mro__:
        if cls in SEQUENCE_PARALLEL_ATTENTION:
            return True, SEQUENCE_PARALLEL_ATTENTION[cls]
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


def apply_sequence_parallel(model: nn.Module, sp_group: Optional[dist.ProcessGroup]) -> nn.Module:
    """Make ``model`` sequence-parallel over ``sp_group`` in place and return it.

    A group of one rank leaves the model untouched. Raises if the model has no split/gather
    markers (nothing would shard the tokens), is already sequence-parallel, or holds an attention
    op under a module type with no sequence-parallel entry.
    """
    state = SequenceParallelState(sp_group)
    if state.size == 1:
        return model
    if any(isinstance(m, (SequenceParallelSplit, SequenceParallelGather)) for m in model.modules()):
        raise ValueError(f"{type(model).__qualname__} is already sequence-parallel")
    # Plan on the original tree, check, then swap: a bad model is left untouched.
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
            f"an axis that is not sharded)"
        )
    splits = sum(isinstance(m, SequenceSplit) for _, _, m in markers)
    gathers = len(markers) - splits
    if not splits or not gathers:
        raise ValueError(
            f"{type(model).__qualname__} has {splits} SequenceSplit and {gathers} SequenceGather "
            f"markers; sequence parallelism needs the model to pass its tokens through both "
            f"(after the embeddings and before the final layer)"
        )
    for module in attention:
        convert_attention_module(module, state)
    for parent, name, marker in markers:
        parent.register_module(name, convert_sequence_marker(marker, state))
    return model


register_sequence_parallel_attention(Attention, UlyssesAttentionOp)
