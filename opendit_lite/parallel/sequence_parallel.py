"""Turn a serial model into a sequence-parallel one in place, in any of the three attention-sharding
modes: ``apply_sequence_parallel(model, group, mode="ulysses" | "ring" | "usp" | "auto", ring_size=None)``.

A diffusers model of a known family (Wan, Flux, CogVideoX, HunyuanVideo, LTX-Video, SD3) goes through
its declared spec (``diffusers_sp/``). Every other model goes through three swaps, all around one
``SequenceParallelState``, and no change to model code:

* ``SequenceSplit`` markers -> ``SequenceParallelSplit`` (keep this rank's shard, pad if needed);
* ``SequenceGather`` markers -> ``SequenceParallelGather`` (all-gather, drop the padding);
* the ``attn_op`` of every attention module -> the sequence-parallel op of its *role* and the mode
  (the table in ``sp_ops.py``). The role is keyed by the owning module's type rather than by the op's
  class because the op's class names the backend (SDPA, flash-attn, ...), which the backend conversion
  may already have changed, while the module says what the op attends over:

  ===========  ==========================================================  =========================
  role         attends over                                                zoo module types
  ===========  ==========================================================  =========================
  self         its own (sharded) token sequence                            ``Attention`` (DiT, STDiT
                                                                           spatial)
  joint        replicated text tokens + the sharded tokens (``joint.py``)  ``JointAttention``
  cross        a replicated context (text): local in every mode            ``CrossAttention``
  serial       an axis that is not sharded: the op stays as it is          ``TemporalAttention``
  ===========  ==========================================================  =========================

An attention op whose module type has no role is an error rather than a silent serial op that would
attend to a shard. Models written outside the zoo: timm's and diffusers' attention modules first get an
``attn_op`` (``foreign_attention.py``); a module that declares ``sequence_parallel_attention`` (one of the roles)
needs no registration; a model without markers is split at its first block's input and gathered at
its last block's output (``boundaries.py``), and then every block must hold an attention op this module
can run.

Modes: ``modes.py`` (head rules, ``auto``); USP's process groups are built once per conversion,
collectively, before any module is converted (``ops.build_groups``). Run it after the backend
conversion (the ops wrap whatever op they find) and before activation checkpointing and data-parallel
wrapping. ``opendit_lite.parallelization.parallelize`` calls ``make_sequence_parallel`` in that place of its
order and prints its rows. See ``comm.py`` for the gradient convention (DDP/ZeRO's world mean of
gradients is exact); docs/sequence_parallel.md for usage, padding, masks and the ring's overlap.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

import torch.distributed as dist
import torch.nn as nn

from opendit_lite.models.blocks import find_blocks
from opendit_lite.models.capabilities import supported_sp_modes
from opendit_lite.models.layers.attention import Attention, AttentionOp
from opendit_lite.models.layers.axis_attention import TemporalAttention
from opendit_lite.models.layers.cross_attention import CrossAttention
from opendit_lite.models.layers.joint_attention import JointAttention
from opendit_lite.models.layers.sequence import SequenceGather, SequenceSplit

from .boundaries import place_sequence_boundaries
from .comm_volume import SPWorkload
from .diffusers_sp import apply_family, family_attention, family_spec
from .foreign_attention import PROTOCOL, SEQUENCE_PARALLEL_ROLES, adapt_foreign_attention, declared_role
from .modes import AutoInputs, ModeChoice, choose_mode
from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState
from .sp_ops import build_groups, effective_mode, op_factory
from .ulysses import (
    SequenceParallelCrossAttentionOp,
    SequenceParallelOp,
    UlyssesAttentionOp,
    UlyssesJointAttentionOp,
)

# Attention module type -> role ("self" | "joint" | "cross" | "serial"). Filled by
# ``register_sequence_parallel_attention``; the model zoo's types are registered at the end of this file.
SEQUENCE_PARALLEL_ATTENTION: Dict[type, str] = {}

# The op classes ``register_sequence_parallel_attention`` also takes, as the roles they stand for.
_ROLE_OF_OP = {UlyssesAttentionOp: "self", UlyssesJointAttentionOp: "joint", SequenceParallelCrossAttentionOp: "cross"}


def register_sequence_parallel_attention(module_type: type, role: Union[str, type, None]) -> None:
    """Declare what the ``attn_op`` of ``module_type`` modules attends over, hence its op in every mode.

    ``role``: "self" (its own token sequence), "joint" (``[text; tokens]``, the text replicated),
    "cross" (a replicated context, e.g. text: no communication) or "serial" / None (an axis that is not
    sharded: the op stays as it is). ``UlyssesAttentionOp`` / ``UlyssesJointAttentionOp`` /
    ``SequenceParallelCrossAttentionOp`` are accepted for "self" / "joint" / "cross". Subclasses follow
    their nearest registered base. A duplicate is an error.
    """
    if module_type in SEQUENCE_PARALLEL_ATTENTION:
        raise ValueError(f"{module_type.__qualname__} already has a sequence-parallel attention entry "
                         f"({SEQUENCE_PARALLEL_ATTENTION[module_type]!r})")
    if role is None:
        role = "serial"
    elif isinstance(role, type):
        if role not in _ROLE_OF_OP:
            raise ValueError(f"register_sequence_parallel_attention takes a role ({', '.join(SEQUENCE_PARALLEL_ROLES)})"
                             f" or one of {', '.join(c.__name__ for c in _ROLE_OF_OP)}; got {role.__qualname__}")
        role = _ROLE_OF_OP[role]
    if role not in SEQUENCE_PARALLEL_ROLES:
        raise ValueError(f"sequence-parallel role {role!r}; expected one of {', '.join(SEQUENCE_PARALLEL_ROLES)}")
    SEQUENCE_PARALLEL_ATTENTION[module_type] = role


def attention_role(module: nn.Module) -> Optional[str]:
    """The role of ``module``'s ``attn_op``: its type's entry, looked up along its MRO, else the role its
    class declares with ``sequence_parallel_attention``; None when it has neither."""
    for cls in type(module).__mro__:
        if cls in SEQUENCE_PARALLEL_ATTENTION:
            return SEQUENCE_PARALLEL_ATTENTION[cls]
    return declared_role(module)


def declared_sp_modes(model: nn.Module) -> Tuple[str, ...]:
    """The modes a model runs under: its diffusers family's spec, else its ``supported_sp_modes``."""
    spec = family_spec(model)
    return spec.supported_sp_modes if spec is not None else supported_sp_modes(model)


@dataclass
class SequenceParallelReport:
    """What ``make_sequence_parallel`` did: the mode that runs (and why, for ``auto`` or an unset ring
    size) and one row per kind of change: ``(what, where, count, detail)``."""

    sp_size: int
    choice: ModeChoice
    rows: List[Tuple[str, str, int, str]] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return self.choice.describe(self.sp_size)


def _heads(name: str, module: nn.Module, modules: Dict[str, nn.Module]) -> Optional[int]:
    """The head count of an attention module (``num_heads`` or ``heads``), or of its parent when the
    module is a processor holding the op (diffusers' ``Attention`` with ``OpAttnProcessor``)."""
    for owner in (module, modules.get(name.rpartition(".")[0])):
        heads = getattr(owner, "num_heads", None) or getattr(owner, "heads", None)
        if isinstance(heads, int):
            return heads
    return None


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


def make_sequence_parallel(model: nn.Module, sp_group: Optional[dist.ProcessGroup], mode: str = "ulysses",
                           ring_size: Optional[int] = None,
                           auto: Optional[AutoInputs] = None) -> SequenceParallelReport:
    """Make ``model`` sequence-parallel over ``sp_group`` in place in ``mode`` ("ulysses", "ring", "usp"
    with ``ring_size``, or "auto", deciding from ``auto``: see ``modes.decide_sp_mode``; DSP is applied by
    ``apply_dsp``, so it is not among the choices here) and report what was done.

    A group of one rank leaves the model untouched. Raises ``SequenceParallelError`` (a ConfigError)
    when the heads do not allow the mode (naming the way out), ``TypeError``/``ValueError`` when the
    model lacks what sequence parallelism needs (markers or a block list, attention modules of known
    roles) or is already sequence-parallel. Everything is checked before anything is changed.
    """
    state = SequenceParallelState(sp_group)
    if state.size == 1:
        return SequenceParallelReport(1, ModeChoice(mode, 1, "sp_group has 1 rank"))
    spec = family_spec(model)
    if spec is not None:
        choice, rows = apply_family(model, spec, sp_group, mode, ring_size, auto)
        return SequenceParallelReport(state.size, choice, rows)
    if any(isinstance(m, (SequenceParallelSplit, SequenceParallelGather)) for m in model.modules()):
        raise ValueError(f"{type(model).__qualname__} is already sequence-parallel")
    adapt_foreign_attention(model)
    # Plan on the (adapted) tree, check, then swap: a bad model is left without sequence parallelism.
    modules = dict(model.named_modules())
    markers, attention, unregistered = [], [], []
    for parent_name, parent in modules.items():
        for child_name, child in parent.named_children():
            if isinstance(child, (SequenceSplit, SequenceGather)):
                markers.append((parent, child_name, child))
            elif isinstance(child, AttentionOp):
                role = attention_role(parent) if child_name == "attn_op" else None
                if role is None:
                    unregistered.append(f"{parent_name}.{child_name}".lstrip("."))
                else:
                    attention.append((parent_name, parent, role))
    if unregistered:
        raise TypeError(
            f"sequence parallelism does not know how to run the attention op(s) {unregistered}: "
            f"register the type of the module holding each as ``attn_op`` with "
            f"register_sequence_parallel_attention(type, role) (role \"serial\" keeps an op serial, e.g. attention "
            f"along an axis that is not sharded), or declare it on the class: {PROTOCOL}"
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
        _check_blocks_attend(blocks, [m for _, m, _ in attention])
    elif not splits or not gathers:
        raise ValueError(
            f"{type(model).__qualname__} has {splits} SequenceSplit and {gathers} SequenceGather "
            f"markers; sequence parallelism needs the model to pass its tokens through both "
            f"(after the embeddings and before the final layer)"
        )
    heads = {}
    for name, module, role in attention:
        count = _heads(name, module, modules)
        if role in ("self", "joint") and count is not None:
            heads[f"{name} ({type(module).__name__})"] = count
    attention_modes = tuple(m for m in declared_sp_modes(model) if m != "dsp")
    choice = choose_mode(mode, ring_size, heads, state.size, attention_modes, auto)

    groups = build_groups(choice, sp_group, state.size)   # collective: before any module changes
    converted = Counter()
    for name, module, role in attention:
        factory = op_factory(choice, role, state.size, groups)
        if factory is None:
            converted[(type(module).__name__, role, "serial")] += 1
            continue
        if isinstance(module.attn_op, SequenceParallelOp):  # a module reached twice is wrapped once
            continue
        module.attn_op = factory(module.attn_op, state)
        converted[(type(module).__name__, role, f"{type(module.attn_op).__name__} ({module.attn_op.backend})")] += 1
    rows = []
    if blocks is not None:
        place_sequence_boundaries(model, blocks, state)
        rows.append(("split", f"input of {type(blocks[0]).__name__} (the first block)", 1,
                     "tokens along dim 1, padded to a multiple of the SP size"))
        rows.append(("gather", f"output of {type(blocks[-1]).__name__} (the last block)", 1, "padding dropped"))
    for parent, name, marker in markers:
        parent.register_module(name, convert_sequence_marker(marker, state))
        kind = "split" if isinstance(marker, SequenceSplit) else "gather"
        rows.append((kind, f"{type(marker).__name__} marker '{name}'", 1, f"dim {marker.dim}"))
    for (cls, role, op), count in converted.items():
        if count:
            rows.append(("serial" if op == "serial" else "attention", cls, count,
                         "attends along an axis that is not sharded: its op stays as it is" if op == "serial"
                         else f"{role}: {op}"))
    return SequenceParallelReport(state.size, choice, rows)


def attention_roles(model: nn.Module) -> List[Tuple[str, nn.Module, Optional[str]]]:
    """(name, module, role) of every attention module sequence parallelism would run, read without
    changing the model: a diffusers family's per its spec, the zoo's and the protocol's per the role of
    the module holding each ``attn_op``."""
    spec = family_spec(model)
    if spec is not None:
        return family_attention(model, spec)
    modules = dict(model.named_modules())
    return [(name, modules[name], attention_role(modules[name])) for name in modules
            if isinstance(getattr(modules[name], "attn_op", None), AttentionOp)]


def sharded_heads(model: nn.Module) -> Dict[str, int]:
    """Head counts of the self/joint attention modules: those whose heads Ulysses shards."""
    modules = dict(model.named_modules())
    heads = {}
    for name, module, role in attention_roles(model):
        count = _heads(name, module, modules)
        if role in ("self", "joint") and count is not None:
            heads[name] = count
    return heads


def sp_workload(model: nn.Module, frames: int, frame_tokens: int, text_tokens: int = 0,
                name: Optional[str] = None) -> SPWorkload:
    """The model's sequence-parallel attention for one sample of ``frames`` x ``frame_tokens`` tokens
    (after patching) and ``text_tokens`` caption tokens, read from its attention modules: a zoo model with
    attention kept serial along an axis (temporal attention) attends per frame, the others over all
    tokens; joint attention carries the text; DSP applies when the model declares it."""
    roles = attention_roles(model)
    sharded = [(n, m) for n, m, r in roles if r in ("self", "joint")]
    joint = [m for _, m, r in roles if r == "joint"]
    # The zoo keeps attention along an axis that is not sharded (temporal) serial: its SP attention runs per
    # frame. A family's serial attention is over its text (a token refiner): its SP attention sees every token.
    per_frame = family_spec(model) is None and any(r == "serial" for _, _, r in roles)
    first = sharded[0][1] if sharded else None
    heads = sharded_heads(model)
    hidden = getattr(first, "inner_dim", None) or (heads.get(sharded[0][0], 1) * getattr(first, "head_dim", 0)
                                                   if first is not None else 0)
    dsp = "dsp" in declared_sp_modes(model)
    return SPWorkload(name or type(model).__name__, tokens=frame_tokens if per_frame else frames * frame_tokens,
                      hidden=int(hidden or getattr(model, "hidden_size", 0)), heads=tuple(heads.values()),
                      layers=max(1, len(sharded)), sequences=frames if per_frame else 1,
                      text_tokens=text_tokens if joint else 0,
                      text_query_layers=sum(not getattr(m, "context_pre_only", False) for m in joint) if joint
                      else None, frames=frames if dsp and per_frame else 0)


def resolve_auto(model: nn.Module, sp_size: int, auto: Optional[AutoInputs]) -> ModeChoice:
    """What ``sp_mode=auto`` runs for ``model`` over ``sp_size`` ranks, dsp included (``modes.decide_sp_mode``)."""
    return choose_mode("auto", None, sharded_heads(model), sp_size, declared_sp_modes(model), auto)


def apply_sequence_parallel(model: nn.Module, sp_group: Optional[dist.ProcessGroup], mode: str = "ulysses",
                            ring_size: Optional[int] = None) -> nn.Module:
    """``make_sequence_parallel`` returning the model (converted in place)."""
    make_sequence_parallel(model, sp_group, mode, ring_size)
    return model


def describe_choice(report: SequenceParallelReport) -> str:
    """The mode that runs, e.g. "ring", "usp (ring 2 x ulysses 2)", "usp (ring 1 x ulysses 2) = ulysses"."""
    running = effective_mode(report.choice, report.sp_size)
    return report.mode + (f" = {running}" if report.choice.mode == "usp" and running != "usp" else "")


# The model zoo's attention module types (SpatialAttention is an Attention and inherits its entry).
register_sequence_parallel_attention(Attention, "self")
register_sequence_parallel_attention(JointAttention, "joint")
register_sequence_parallel_attention(CrossAttention, "cross")
register_sequence_parallel_attention(TemporalAttention, "serial")
