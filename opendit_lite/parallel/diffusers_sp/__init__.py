"""Sequence parallelism for the diffusers families (Wan, Flux, CogVideoX, HunyuanVideo, LTX-Video, SD3):
a table of specs keyed by diffusers class name (each family declares its own in
``opendit_lite/families/<family>/sp_spec.py``; ``register_family_spec`` adds one, which registering
the family does), the hooks that split and gather the image tokens (``hooks.py``) and the attention
intercept that routes each processor's core through the package's sequence-parallel ops
(``intercept.py``), in every mode (ulysses, ring, usp) and role (self, joint, cross).

    report = apply_family(model, spec, sp_group, mode="ring")   # via parallel.apply_sequence_parallel

``family_spec(model)`` finds a model's spec: its class must be the diffusers class of that name (a
user class of the same name is not a diffusers family).

Only image/video tokens are sharded; text tokens stay whole on every rank (so text lengths need not
divide the SP size, and text refiners run as they are).

Why not diffusers' own context parallelism (``enable_parallelism`` + ``ContextParallelConfig``, driven
around its accelerator-only set-up on CPU gloo, fp32): it pads nothing (uneven token counts fail its
equipartition assertion; its "anything" mode needs an accelerator), its plans shard the text too for
Flux and LTX (text length must divide the SP size), LTX's Ulysses backward reshapes key/value
gradients with the query length (crashes for cross-attention) and its per-head text mask is not split
with the heads, a diffusers-style plan is silently wrong for HunyuanVideo (the all-to-all of [image,
text] collects the text P times: gradient error 0.57) and for SD3/CogVideoX (their processors call
SDPA directly, so attention stays local: 0.54), its ring backward is wrong at ring degree 4 (see
``parallel/ring.py``), and its gather's backward makes the SP-group *sum* the serial gradient where the
package's data-parallel mean needs the SP-group *mean*. Where it works (Wan and Flux at token and text
counts divisible by P) it matches; our path covers all six with padding, masks, ring and USP.
"""

from typing import Dict, Optional, Tuple

import torch.distributed as dist
import torch.nn as nn

from opendit_lite.converter.class_swap import swap_class
from opendit_lite.errors import SequenceParallelError
from opendit_lite.models.layers.attention import SDPAAttentionOp

from ..modes import AutoInputs, choose_mode
from ..sp_ops import build_groups, op_factory
from .hooks import BeginForward, EndForward, FamilyState, GatherOutput, SplitInputs, SplitOutputs, forward_parameters
from .intercept import InterceptedAttention
from .spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt, find_modules, matches

FAMILIES: Dict[str, FamilySpec] = {}


def register_family_spec(spec: FamilySpec) -> None:
    """Declare the sequence-parallel spec of a diffusers transformer class (a duplicate is an error)."""
    if spec.cls_name in FAMILIES:
        raise ValueError(f"{spec.cls_name} already has a sequence-parallel family spec "
                         f"({FAMILIES[spec.cls_name].family})")
    FAMILIES[spec.cls_name] = spec


def family_spec(model: nn.Module) -> Optional[FamilySpec]:
    """The spec of ``model``'s diffusers class, or None (not a diffusers class of a known family)."""
    cls = type(model)
    spec = FAMILIES.get(cls.__name__)
    return spec if spec is not None and cls.__module__.startswith("diffusers.") else None


def _attention_modules(model: nn.Module):
    """diffusers attention modules: those holding a processor (``Attention``, ``WanAttention``, ...)."""
    return [(name, m) for name, m in model.named_modules() if hasattr(m, "processor") and hasattr(m, "heads")]


def _backend(processor) -> Tuple[Optional[str], str]:
    """(the diffusers attention backend a processor dispatches to, where that choice comes from)."""
    backend, source = getattr(processor, "_attention_backend", None), "its processor's"
    if backend is None:
        try:
            from diffusers.models.attention_dispatch import _AttentionBackendRegistry
        except ImportError:
            return None, ""
        backend = _AttentionBackendRegistry.get_active_backend()[0]
        source = ("diffusers' active (process-wide: set by set_attention_backend on any model, or "
                  "DIFFUSERS_ATTN_BACKEND)")
    return str(getattr(backend, "value", backend)), source


def _check_attention(spec: FamilySpec, name: str, module: nn.Module, entry: Optional[AttentionSpec]) -> None:
    where = f"{spec.cls_name}: attention module '{name}' ({type(module).__name__})"
    if entry is None:
        raise SequenceParallelError(f"{where} is not in the family's sequence-parallel spec "
                                    f"(opendit_lite/families/<family>/sp_spec.py): this diffusers version has a layout "
                                    f"the spec does not know; train it with sp_size=1 or add the module to the spec")
    processor = type(module.processor).__name__
    if processor not in entry.processors:
        raise SequenceParallelError(f"{where} runs processor {processor}, but sequence parallelism intercepts only "
                                    f"{', '.join(entry.processors)} there (IP-adapter, fused and custom processors "
                                    f"are not supported): restore the default processor, or train with sp_size=1")
    backend, source = _backend(module.processor)
    if entry.role != "serial" and backend is not None and "native" not in backend:
        raise SequenceParallelError(f"{where} would run {source} attention backend {backend!r}, which does not call "
                                    f"torch's scaled_dot_product_attention, the call sequence parallelism routes: use "
                                    f"model.reset_attention_backend(), or model.set_attention_backend('native') "
                                    f"(which also resets the process-wide choice), and unset DIFFUSERS_ATTN_BACKEND")
    if getattr(module.processor, "_parallel_config", None) is not None:
        raise SequenceParallelError(f"{where} has diffusers' own context parallelism enabled (enable_parallelism); "
                                    f"use one of the two")


def family_attention(model: nn.Module, spec: FamilySpec):
    """(name, module, role) of the model's attention modules, each matched to its spec entry (role None
    when the spec does not cover it); nothing is changed."""
    out = []
    for name, module in _attention_modules(model):
        entry = next((a for a in spec.attention if matches(name, a.pattern)), None)
        out.append((name, module, entry.role if entry is not None else None))
    return out


def _describe_split(spec: Split) -> str:
    rank = f", only when it has {spec.ndim} dimensions" if spec.optional else ""
    return f"dim {spec.dim}{rank}"


def apply_family(model: nn.Module, spec: FamilySpec, sp_group: Optional[dist.ProcessGroup], mode: str = "ulysses",
                 ring_size: Optional[int] = None, auto: Optional[AutoInputs] = None):
    """Make a diffusers model of ``spec``'s family sequence-parallel over ``sp_group`` in place; returns
    (``ModeChoice``, report rows ``(what, where, count, detail)``). Everything is checked before anything
    is changed, so a refusal leaves the model serial. ``auto``: what ``sp_mode=auto`` decides from."""
    state = FamilyState(sp_group)
    size = state.size
    if getattr(model, "sequence_parallel_state", None) is not None:
        raise ValueError(f"{type(model).__qualname__} is already sequence-parallel")
    if getattr(model, "_parallel_config", None) is not None:
        raise SequenceParallelError(f"{spec.cls_name} already has diffusers' enable_parallelism applied; use one of "
                                    f"the two")
    reason = spec.unsupported(model)
    if reason:
        raise SequenceParallelError(f"{spec.cls_name} cannot run sequence-parallel: {reason}. Train it with sp_size=1.")

    # 1. attention modules: every one covered by the spec, with a processor and backend we can route
    attention = []
    for name, module in _attention_modules(model):
        entry = next((a for a in spec.attention if matches(name, a.pattern)), None)
        _check_attention(spec, name, module, entry)
        attention.append((name, module, entry))
    heads = {name: module.heads for name, module, entry in attention if entry.role in ("self", "joint")}
    choice = choose_mode(mode, ring_size, heads, size, spec.supported_sp_modes, auto)

    # 2. split and gather points, resolved before the first hook goes in
    points = []
    for split in spec.splits:
        targets = find_modules(model, split.where)
        if not targets:
            raise SequenceParallelError(f"{spec.cls_name}: the spec splits at '{split.where}', which this model "
                                        f"does not have")
        for name, module in targets:
            params = forward_parameters(module)
            missing = [arg for arg in split.inputs if arg not in params]
            if missing:
                raise SequenceParallelError(f"{spec.cls_name}: '{split.where or '<model>'}'.forward has no argument "
                                            f"{missing}; this diffusers version differs from the spec")
            points.append((name, module, split, params))
    gathers = []
    for where, gather in spec.gathers.items():
        targets = find_modules(model, where)
        if not targets:
            raise SequenceParallelError(f"{spec.cls_name}: the spec gathers at '{where}', which this model lacks")
        gathers += [(name, module, gather) for name, module in targets]

    # 3. the USP groups (collective: every rank, before any module changes), then the swaps
    groups = build_groups(choice, sp_group, size)
    model.register_forward_pre_hook(BeginForward(state), prepend=True)
    for name, module, split, params in points:
        if split.inputs:
            module.register_forward_pre_hook(SplitInputs(state, name, split.inputs, params), with_kwargs=True)
        if split.outputs:
            module.register_forward_hook(SplitOutputs(state, name, split.outputs))
    for name, module, gather in gathers:
        module.register_forward_hook(GatherOutput(state, name, gather))
    ops = {}
    for name, module, entry in attention:
        factory = op_factory(choice, entry.role, size, groups)
        if factory is None:
            continue
        inner = getattr(module, "attn_op", None) or SDPAAttentionOp()
        module.attn_op = factory(inner, state)
        module.sequence_parallel_role, module.sequence_parallel_text = entry.role, entry.text
        module.sequence_parallel_query_mask = entry.query_mask
        module.sequence_parallel_name = name
        swap_class(module, InterceptedAttention)
        ops.setdefault(entry.pattern, []).append(module)
    model.register_forward_hook(EndForward(state, expect_attention=bool(ops)))
    model.sequence_parallel_state = state

    # 4. what was done, for the parallelize report
    rows = [("family", f"{spec.cls_name} ({spec.family})", 1,
             f"image tokens sharded, text replicated; diffusers' context parallelism not used: "
             f"{spec.why_not_diffusers_cp}")]
    for split in spec.splits:
        for arg, entry in list(split.inputs.items()) + list(split.outputs.items()):
            first = entry[0] if isinstance(entry, tuple) else entry
            what = f"input '{arg}'" if isinstance(arg, str) else f"output {arg}"
            rows.append(("split", split.where or "<model>", 1,
                         f"{what} along {_describe_split(first)}, padded to a multiple of {size}"))
    for where, gather in spec.gathers.items():
        rows.append(("gather", where, 1, f"output along dim {gather.dim}, padding dropped"))
    for entry in spec.attention:
        modules = [m for n, m, e in attention if e is entry]
        if not modules:
            continue
        processor = type(modules[0].processor).__name__
        if entry.role == "serial":
            rows.append(("serial", entry.pattern, len(modules), f"{processor}: text only, left as it is"))
            continue
        text = f", text {entry.text} and replicated" if entry.text else ""
        rows.append(("attention", entry.pattern, len(modules),
                     f"{processor} -> {type(modules[0].attn_op).__name__} ({modules[0].attn_op.backend}; "
                     f"{entry.role}{text})"))
    return choice, rows


__all__ = ["AttentionSpec", "FAMILIES", "FamilySpec", "Gather", "Split", "SplitAt", "apply_family", "family_spec",
           "register_family_spec"]
