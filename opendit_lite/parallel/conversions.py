"""Sequence parallelism through the module converter, switched on by ``sp_size > 1``::

    ModuleConverter(config, sp_group=mesh.sp_group).convert(model)

does what ``apply_sequence_parallel(model, mesh.sp_group)`` does, with the same functions:

=========================  =====================  =========================================
name                       source type            replacement
=========================  =====================  =========================================
sequence_parallel_split    ``SequenceSplit``      ``SequenceParallelSplit``
sequence_parallel_gather   ``SequenceGather``     ``SequenceParallelGather``
sequence_parallel_attn     ``Attention`` (and     the module with its ``attn_op`` wrapped
                           every type registered  (``UlyssesAttentionOp`` for ``Attention``)
                           below), subclasses too
=========================  =====================  =========================================

All run at ``PRIORITY_WRAPPER``, after the backend conversions, so the Ulysses op wraps the final
backend (flash-attn or SDPA). The factories of one ``ModuleConverter`` share one
``SequenceParallelState`` (kept in its context as ``sp_state``): use one converter per model. An
EMA copy made with ``copy.deepcopy`` after conversion gets its own state automatically.

Unlike ``apply_sequence_parallel``, the converter only sees the module types it was told about
(registered, or declaring ``sequence_parallel_attention``, see foreign.py): an attention module of
another type would stay serial, and it places no split/gather for a model without markers. Use
``apply_sequence_parallel`` (what ``parallelize`` calls) for models written outside the zoo.
"""

from typing import Any, Optional

import torch.nn as nn

from opendit_lite.converter.registry import PRIORITY_WRAPPER, config_value, register_conversion
from opendit_lite.models.layers.attention import Attention
from opendit_lite.models.layers.sequence import SequenceGather, SequenceSplit

from .foreign import declared_role
from .sequence import SequenceParallelState
from .sequence_parallel import (
    SEQUENCE_PARALLEL_ATTENTION,
    SPOpFactory,
    convert_attention_module,
    convert_sequence_marker,
)
from .ulysses import UlyssesAttentionOp


def _enabled(config: Any) -> bool:
    return int(config_value(config, "sp_size")) > 1


def _describe(config: Any) -> str:
    return f"sp_size={config_value(config, 'sp_size')}"


def _state(config: Any, context: dict) -> SequenceParallelState:
    """The converter's shared state, created on first use from ``context['sp_group']``."""
    if "sp_group" not in context:
        raise ValueError("sp_size > 1 needs the sequence-parallel group: "
                         "ModuleConverter(config, sp_group=mesh.sp_group)")
    state = context.get("sp_state")
    if state is None or state.group is not context["sp_group"]:
        state = context["sp_state"] = SequenceParallelState(context["sp_group"])
        sp_size = int(config_value(config, "sp_size"))
        if state.size != sp_size:
            raise ValueError(f"config sp_size={sp_size} but the sp_group given to the converter has "
                             f"{state.size} ranks; pass the SP group of a mesh built with that sp_size")
    return state


def _convert_marker(module: nn.Module, config: Any, context: dict) -> nn.Module:
    return convert_sequence_marker(module, _state(config, context))


def _convert_attention(module: nn.Module, config: Any, context: dict) -> nn.Module:
    return convert_attention_module(module, _state(config, context))


def register_sequence_parallel_attention(module_type: type, op_factory: Optional[SPOpFactory]) -> None:
    """Declare how the ``attn_op`` of ``module_type`` modules runs under sequence parallelism.

    ``op_factory(inner_op, state)`` builds the ``SequenceParallelOp`` that replaces it (e.g.
    ``UlyssesAttentionOp`` for self-attention over the tokens, ``SequenceParallelCrossAttentionOp``
    for attention to a replicated context); None keeps it serial (attention along an axis that is
    not sharded). Subclasses follow their nearest registered base. Registers the type both for
    ``apply_sequence_parallel`` and with the module converter; a duplicate is an error.
    """
    if module_type in SEQUENCE_PARALLEL_ATTENTION:
        raise ValueError(f"{module_type.__qualname__} already has a sequence-parallel attention entry "
                         f"({SEQUENCE_PARALLEL_ATTENTION[module_type]!r})")
    SEQUENCE_PARALLEL_ATTENTION[module_type] = op_factory
    register_conversion(module_type, _convert_attention, name="sequence_parallel_attn", enabled=_enabled,
                        describe=_describe, priority=PRIORITY_WRAPPER, include_subclasses=True)


# Attention modules that declare their role (the protocol in foreign.py, which timm's and
# diffusers' adapted modules follow): the same swap, without a registry entry.
register_conversion(nn.Module, _convert_attention, name="sequence_parallel_attn", enabled=_enabled,
                    describe=_describe, priority=PRIORITY_WRAPPER, include_subclasses=True,
                    when=lambda module: declared_role(module) is not None)
for _marker, _name in ((SequenceSplit, "sequence_parallel_split"), (SequenceGather, "sequence_parallel_gather")):
    register_conversion(_marker, _convert_marker, name=_name, enabled=_enabled, describe=_describe,
                        priority=PRIORITY_WRAPPER)
register_sequence_parallel_attention(Attention, UlyssesAttentionOp)
