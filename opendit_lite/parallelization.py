"""``parallelize(model, ...)``: every training-time transformation of a model, in one place (also
importable as ``from opendit_lite import parallelize``).

    report = parallelize(model, sp_group=plugin.sp_group, sp_mode="ulysses", fused_adaln=True,
                         attention_backend="auto", selective_ratio=0.5, ac_offload=False, compile=True)
    print(report)   # a short table: step, what was swapped, how many, what was left and why

It applies seven small steps to the serial model, in place, each with explicit arguments, and the
booster plugin wraps (DDP) or shards (ZeRO) the result afterwards. The order, and why:

0. ``apply_lora`` (``lora_rank`` > 0): peft adapters on the chosen linear layers, the rest frozen.
   First, on the plain model: peft swaps ``nn.Linear`` children for adapter layers, which every
   later step keeps (the converter's class swaps keep a block's children, checkpointing wraps the
   block's forward, compile traces the adapted layers), and the plugin builds the optimizer from
   the trainable parameters the adapters leave.
0b. ``apply_base_precision`` (``base_precision`` fp8 / nf4, LoRA runs): the frozen linear layers of the
   blocks store their weights in FP8 or NF4 (``opendit_lite.memory.low_precision``). Right after LoRA,
   which it needs (it replaces the frozen ``base_layer`` peft left, not the adapters), and before block
   swapping, so that the host keeps (and copies) the low-precision weights.
1. ``apply_kernels``: backend swaps through the module converter (fused AdaLN, fused LayerNorm,
   flash attention). First, because the next step wraps whichever attention op is in place: the
   Ulysses op must wrap the final backend, not one about to be replaced.
2. ``apply_sequence_parallel``: Ulysses, ring, USP (``sp_ring_size``), ``auto`` or DSP, as the model
   declares it supports (``supported_sp_modes``; a diffusers family's spec), through
   ``opendit_lite.parallel``. Before checkpointing and compile so that both see the collectives:
   recomputation repeats the all-to-alls and ring exchanges in the same order on every rank, and
   compiled graphs contain them.
2b. ``apply_block_swap`` (``blocks_to_swap`` > 0): N blocks' frozen tensors live in host memory and are
   fetched for each use (``opendit_lite.memory.block_swap``). After every module swap, so that it holds
   the final modules' tensors; before checkpointing, which must wrap the swapped forward so that its
   recomputation in backward fetches the weights again.
3. ``apply_activation_checkpointing`` (with CPU offload): replaces each chosen block's forward.
   After every module swap, so the recomputed forward is the final one; before compile, so the
   compiled block graph holds the checkpointed region (recomputation inside the graph).
4. ``apply_compile``: ``torch.compile`` per block (one graph per block class, reused by all
   blocks of that class). Last, so it traces what the block finally runs; per block rather than
   the whole model, so a graph break in one block costs one block, and before the plugin's
   wrapping, which then sees ordinary modules.

A sequence-parallel group of more than one rank in which nothing was made sequence-parallel is an
error (every rank would compute the full sequence); a requested kernel swap that matched nothing
warns on stderr.

Importing this module registers the diffusers families (``opendit_lite.families``): each step finds a
family's piece (block swaps, sequence-parallel spec, block lists, LoRA targets) in its mechanism's table.
"""

import textwrap
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch.distributed as dist
import torch.nn as nn

from . import families as _families  # noqa: F401  (the diffusers families' pieces, registered with the steps' mechanisms)
from .activation_checkpointing import CheckpointReport
from .activation_checkpointing import apply_activation_checkpointing as checkpoint_blocks
from .activation_checkpointing.wrap import BUILTIN_DISABLED, builtin_checkpointing_on
from .converter import ConversionReport, ModuleConverter, adaln_model_notes
from .errors import ConfigError, SequenceParallelError
from .memory import SwapReport
from .memory import apply_base_precision as store_base
from .memory import apply_block_swap as swap_blocks
from .models.blocks import find_blocks
from .models.capabilities import check_sp_mode, supports_gradient_checkpointing, unused_parameters
from .models.experts import NoiseExperts
from .models.lora import apply_lora as inject_adapters


@dataclass(frozen=True)
class StepRow:
    """One line of the report: a step, what it swapped or applied, how many, what it left and why."""

    step: str
    swapped: str
    count: int
    left: str = ""


# Column widths past which the report's cells wrap onto continuation lines.
_SWAPPED_WIDTH, _LEFT_WIDTH = 64, 72


@dataclass
class ParallelizeReport:
    """What ``parallelize`` did, step by step; ``str()`` is a short table for the training log."""

    rows: List[StepRow] = field(default_factory=list)
    conversion: Optional[ConversionReport] = None       # the module converter's own report
    checkpointing: Optional[CheckpointReport] = None    # None when no block was checkpointed
    swap: Optional[SwapReport] = None                   # None when no block is swapped

    def count(self, step: str) -> int:
        """Modules (or blocks) changed by ``step``."""
        return sum(row.count for row in self.rows if row.step == step)

    def __str__(self) -> str:
        header = StepRow("step", "swapped / applied", "count", "left, and why")  # type: ignore[arg-type]
        rows = [header, *self.rows]
        # Long cells (a model family's notes) wrap within their column on continuation lines.
        swapped = [textwrap.wrap(r.swapped, _SWAPPED_WIDTH) or [""] for r in rows]
        left = [textwrap.wrap(r.left or "-", _LEFT_WIDTH) for r in rows]
        widths = [max(len(r.step) for r in rows), max(len(line) for cell in swapped for line in cell),
                  max(len(str(r.count)) for r in rows)]
        lines = ["parallelize:"]
        for r, swapped_lines, left_lines in zip(rows, swapped, left):
            for i in range(max(len(swapped_lines), len(left_lines))):
                step, count = (r.step, str(r.count)) if i == 0 else ("", "")
                cell = swapped_lines[i] if i < len(swapped_lines) else ""
                note = left_lines[i] if i < len(left_lines) else ""
                lines.append(f"  {step:<{widths[0]}}  {cell:<{widths[1]}}  {count:>{widths[2]}}  {note}".rstrip())
        return "\n".join(lines)


def _warn(message: str) -> None:
    """A requested feature that did not apply: a visible warning (stderr), not a log line."""
    warnings.warn(f"parallelize: {message}", UserWarning, stacklevel=3)


def _group_size(sp_group: Optional[dist.ProcessGroup]) -> int:
    if sp_group is None or not dist.is_initialized():
        return 1
    return dist.get_world_size(sp_group)


# ------------------------------------------------------------------------------------------ steps

def apply_lora(model: nn.Module, *, rank: int = 0, alpha: float = 16.0, dropout: float = 0.0,
               targets: Optional[Sequence[str]] = None) -> List[StepRow]:
    """peft LoRA adapters of rank ``rank`` on the linear layers ``targets`` (None: the model's usual
    ones, ``models.capabilities.lora_targets``), the rest of the model frozen; nothing for rank 0."""
    if not rank:
        return [StepRow("lora", "off", 0, "lora rank 0: every parameter trains")]
    report = inject_adapters(model, rank=rank, alpha=alpha, dropout=dropout, targets=targets)
    swapped = f"peft LoRA rank {rank}, alpha {alpha:g} on {', '.join(report.targets)}"
    return [StepRow("lora", swapped, report.layers, str(report))]


def freeze_unused_parameters(model: nn.Module) -> List[StepRow]:
    """Freeze the parameters nothing the model returns depends on (``models.capabilities.unused_parameters``):
    they would get no gradient, which DDP and ZeRO's bucketed reductions refuse. A row only when there are some."""
    names = unused_parameters(model)
    if not names:
        return []
    parameters = dict(model.named_parameters())
    for name in names:
        parameters[name].requires_grad_(False)
    return [StepRow("unused_parameters", "frozen: " + ", ".join(names), len(names),
                    "nothing the model returns depends on them: no gradient")]


def apply_base_precision(model: nn.Module, *, base_precision: str = "none") -> List[StepRow]:
    """The frozen linear weights of the blocks stored in ``base_precision`` ("fp8", "nf4"; "none": as loaded)."""
    if base_precision in (None, "none"):
        return [StepRow("base_precision", "off", 0, "as loaded")]
    report = store_base(model, base_precision)
    return [StepRow("base_precision", f"{report.layers} frozen linear layers -> {base_precision}", report.layers,
                    str(report))]


def apply_block_swap(model: nn.Module, *, blocks_to_swap: int = 0):
    """``blocks_to_swap`` blocks' frozen tensors in host memory, fetched for each use; returns (rows, the
    SwapReport or None when off). Refuses (ConfigError) more blocks than the model has, or blocks whose
    parameters all train."""
    if not blocks_to_swap:
        return [StepRow("block_swap", "off", 0, "blocks_to_swap=0")], None
    report = swap_blocks(model, blocks_to_swap, recomputed=lambda: builtin_checkpointing_on(model))
    return [StepRow("block_swap", f"{len(report.swapped)} of {len(report.blocks)} blocks' frozen weights in host "
                                  f"memory", len(report.swapped), str(report))], report


def apply_kernels(model: nn.Module, *, fused_adaln: bool = False, fused_layernorm: bool = False,
                  attention_backend: str = "sdpa"):
    """Backend swaps through the module converter; returns (rows, the converter's report).

    A swap that was asked for and replaced nothing warns: "fused_adaln" on a model without
    ``LayerNormModulate`` or a block family it knows, "fused_layernorm" without an affine
    ``nn.LayerNorm``, and ``attention_backend="flash"`` when flash-attn is not installed. For a model
    class with registered fused-AdaLN notes (the diffusers families, ``register_adaln_model``) the
    fused_adaln row says what was fused and what was left and why, and the warning gives that reason."""
    report = ModuleConverter(fused_adaln=fused_adaln, fused_layernorm=fused_layernorm,
                             attention_backend=attention_backend).convert(model)
    notes = adaln_model_notes(model)
    rows = []
    for section in report.sections:
        pairs = Counter((r.old_type.__name__, r.new_type.__name__) for r in section.replaced)
        swapped = ", ".join(f"{old} -> {new}" for old, new in pairs) or section.name
        if not section.enabled:
            left = "not requested" if section.note is None else section.note
            if section.name == "attention_backend" and attention_backend == "flash":
                _warn(f"attention_backend='flash' was requested but kept SDPA: {section.note}")
                left += " (warned)"
            rows.append(StepRow("kernels", f"{section.name}: off", 0, left))
            continue
        left = section.note or ""
        family_notes = notes if section.name == "fused_adaln" and notes is not None else None
        if family_notes is not None:
            left = "; ".join((*family_notes.left, left)) if left else "; ".join(family_notes.left)
            if section.replaced:
                swapped = f"fused_adaln in {family_notes.model}: {family_notes.fused}"
        if not section.replaced:
            reason = ("; ".join(family_notes.left) if family_notes is not None else
                      "no module of the type it replaces (see opendit_lite.converter.builtin)")
            if section.name == "fused_adaln" and family_notes is None:
                reason = ("no LayerNormModulate, no block of a registered family, and no block following the "
                          "adaln_norms / norm_modulate protocol (list the modulated affine-free LayerNorms in "
                          "adaln_norms = (\"norm1\", ...) and call norm_modulate(norm, x, shift, scale) from "
                          "opendit_lite.converter; see opendit_lite/converter/adaln_protocol.py)")
            _warn(f"{section.name} was requested but matched nothing in {type(model).__name__}: {reason}; "
                  f"the model runs without it")
            left = "matched nothing (warned)" + (f"; {left}" if left else "")
        rows.append(StepRow("kernels", swapped, len(section.replaced), left))
    return rows, report


def _attention_modules(model: nn.Module) -> List[str]:
    """``Class (qualified.name, ...)`` for the modules that look like attention, for error messages:
    modules holding an ``attn_op``, ``nn.MultiheadAttention``, and classes named *Attention*."""
    found = {}
    for name, module in model.named_modules():
        cls = type(module)
        if (hasattr(module, "attn_op") or isinstance(module, nn.MultiheadAttention)
                or ("attention" in cls.__name__.lower() and not cls.__name__.endswith("Op"))):
            found.setdefault(cls.__name__, []).append(name or "<root>")
    return [f"{cls} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" for cls, names in found.items()]


def _unsupported(model: nn.Module, sp_mode: str, size: int, reason: str) -> SequenceParallelError:
    """One short paragraph: what did not apply and why, plus how to add an ``attn_op`` only when the
    model's attention modules have none (the reason itself names missing markers or registrations)."""
    reason = " ".join(reason.split()).rstrip(".")
    advice = ""
    found = _attention_modules(model)
    if "attn_op" not in reason and not any(hasattr(m, "attn_op") for m in model.modules()):
        example = found[0].split(" ")[0] if found else "MyAttention"
        advice = (f" Its attention ({'; '.join(found[:2]) if found else 'none found'}) calls no attn_op: give each "
                  f"attention module an attn_op submodule (opendit_lite.models.layers.attention.AttentionOp) and "
                  f"register_sequence_parallel_attention({example}, UlyssesAttentionOp) from opendit_lite.parallel.")
    return SequenceParallelError(
        f"Sequence parallelism over {size} ranks (sp_mode={sp_mode}) made nothing in {type(model).__name__} "
        f"sequence-parallel: {reason}.{advice} Or use sp_size=1.")


def apply_sequence_parallel(model: nn.Module, *, sp_group: Optional[dist.ProcessGroup],
                            sp_mode: str = "ulysses", sp_ring_size: Optional[int] = None,
                            sp_auto=None) -> List[StepRow]:
    """Ulysses, ring, USP or ``auto`` (``opendit_lite.parallel.make_sequence_parallel``) or DSP
    (``opendit_lite.parallel.apply_dsp``) over ``sp_group``; nothing for a group of one rank.

    Raises ``ConfigError`` when the model does not declare ``sp_mode`` (its ``supported_sp_modes``, or
    its diffusers family's spec) and ``SequenceParallelError`` (a ConfigError) when the heads do not
    allow the mode (naming ring/usp) or nothing in the model became sequence-parallel. ``sp_auto``
    (``opendit_lite.parallel.AutoInputs``: the workload, links, nodes) is what ``sp_mode=auto`` decides from
    (``parallel.modes.decide_sp_mode``; the planner prints the same choice). The first row names the mode
    (and why, for ``auto``) and what was swapped; the rows after it say where the tokens are split and
    gathered and which op each attention module (or diffusers processor) runs. A module declaring
    ``sequence_parallel_networks()`` ((name, network) pairs: Wan 2.2's experts, or the teacher, student and
    critic of a pipeline's distillation) gets each network converted as if it were the model."""
    from . import parallel  # the collectives and SP ops are only needed here

    size = _group_size(sp_group)
    if size == 1:
        return [StepRow("sequence_parallel", "off", 0, "sp_group has 1 rank")]
    networks = getattr(model, "sequence_parallel_networks", None)
    if networks is not None:  # a module of several networks (a pipeline's distillation): each as the model
        rows = []
        for name, network in networks():
            part = apply_sequence_parallel(network, sp_group=sp_group, sp_mode=sp_mode, sp_ring_size=sp_ring_size,
                                           sp_auto=sp_auto)
            rows += [StepRow(row.step, f"{name}: {row.swapped}", row.count, row.left) for row in part]
        return rows
    check_sp_mode(model, sp_mode, parallel.declared_sp_modes(model))
    if sp_ring_size is not None and sp_mode != "usp":
        raise ConfigError(f"sp_ring_size={sp_ring_size} sets the ring degree of sp_mode=usp, but sp_mode is {sp_mode}: "
                          f"set sp_mode=usp or leave sp_ring_size unset.")
    auto_choice = None
    if sp_mode == "auto" and "dsp" in parallel.declared_sp_modes(model):  # DSP is applied apart: decide first
        auto_choice = parallel.resolve_auto(model, size, sp_auto)
        sp_mode = auto_choice.mode
        sp_ring_size = auto_choice.ring_size if sp_mode == "usp" else None
    before = Counter(type(m) for m in model.modules())
    try:
        if sp_mode == "dsp":
            parallel.apply_dsp(model, sp_group)
            report = None
        else:
            report = parallel.make_sequence_parallel(model, sp_group, sp_mode, sp_ring_size, sp_auto)
    except SequenceParallelError:
        raise
    except (TypeError, ValueError) as e:  # the model lacks what this mode needs: say how to add it
        raise _unsupported(model, sp_mode, size, str(e)) from e
    new = Counter(type(m) for m in model.modules()) - before
    if not new:
        raise _unsupported(model, sp_mode, size, "no attention op or sequence marker was swapped.")
    serial = Counter(type(m).__name__ for m in model.modules()
                     if isinstance(getattr(m, "attn_op", None), nn.Module)
                     and not isinstance(m.attn_op, parallel.SequenceParallelOp))
    left = (f"serial attention: {', '.join(f'{n} x{c}' for n, c in serial.items())} "
            f"({'DSP keeps every axis whole' if sp_mode == 'dsp' else 'axis not sharded'})") if serial else ""
    swapped = ", ".join(f"{cls.__name__} x{count}" for cls, count in new.items())
    mode = "dsp" if report is None else parallel.describe_choice(report)
    rows = [StepRow("sequence_parallel", f"{mode} over {size} ranks: {swapped}", sum(new.values()), left)]
    reason = auto_choice.reason if auto_choice is not None else (report.choice.reason if report is not None else "")
    if reason:  # sp_mode=auto, or usp without sp_ring_size: say why
        rows.append(StepRow("sequence_parallel", f"  mode: {mode}", 0, reason))
    for what, where, count, detail in ([] if report is None else report.rows):
        rows.append(StepRow("sequence_parallel", f"  {what}: {where}", count, detail))
    return rows


def apply_activation_checkpointing(model: nn.Module, *, selective_ratio: float = 1.0, offload: bool = False):
    """Checkpoint all but a fraction ``selective_ratio`` of the model's blocks (offloading their
    inputs to CPU with ``offload``); returns (rows, the CheckpointReport or None when off).

    A diffusers model whose own gradient checkpointing is on gets it turned off with a warning
    (its blocks would be checkpointed twice); with checkpointing off here, the row says diffusers'
    is on."""
    if selective_ratio >= 1.0 and not offload:
        left = "selective_ratio=1: no block checkpointed"
        if builtin_checkpointing_on(model):
            left += "; the model's own gradient checkpointing (diffusers') is on and checkpoints every block"
        return [StepRow("activation_checkpointing", "off", 0, left)], None
    if not supports_gradient_checkpointing(model):
        raise ConfigError(f"{type(model).__name__} declares supports_gradient_checkpointing = False; "
                          f"set selective_ratio=1 and ac_offload=false.")
    report = checkpoint_blocks(model, selective_ratio, offload=offload)
    kept = len(report.blocks) - len(report.checkpointed)
    what = f"{report.source}: checkpointed{' + inputs offloaded to CPU' if offload else ''}"
    notes = [f"{kept} of {len(report.blocks)} blocks not (selective_ratio={selective_ratio})"] if kept else []
    if report.disabled_builtin:
        _warn(f"{type(model).__name__}: {BUILTIN_DISABLED}; selective_ratio={selective_ratio} decides which blocks "
              f"are checkpointed")
        notes.append(BUILTIN_DISABLED + " (warned)")
    return [StepRow("activation_checkpointing", what, len(report.checkpointed), "; ".join(notes))], report


def apply_compile(model: nn.Module, *, enabled: bool = True, backend: Optional[str] = None,
                  cuda_graphs: bool = False, swapped: int = 0) -> List[StepRow]:
    """``torch.compile`` each of the model's blocks in place (``nn.Module.compile``: parameter names
    and state-dict keys stay the same). ``backend``: torch.compile's (None: its default, inductor).
    ``cuda_graphs``: mode "reduce-overhead", each block's graphs replayed as CUDA graphs (CUDA and
    fixed shapes; ``opendit_lite.training.cuda_graphs`` checks a config asking for it)."""
    if not enabled:
        return [StepRow("compile", "off", 0, "compile=false")]
    blocks = find_blocks(model)
    options = {} if backend is None else {"backend": backend}
    if cuda_graphs:
        options["mode"] = "reduce-overhead"
    for block in blocks:
        block.compile(**options)
    names = Counter(type(b).__name__ for b in blocks)
    graphs = ", CUDA graphs" if cuda_graphs else ""
    what = f"torch.compile({backend or 'default backend'}{graphs}) per block: " + ", ".join(names)
    left = "the rest of the model runs eagerly"
    if swapped:
        left += (f"; the {swapped} swapped blocks too (their weight fetches and saved-tensor hooks break the "
                 f"graph)")
    return [StepRow("compile", what, len(blocks), left)]


# ------------------------------------------------------------------------------------ the pipeline

def parallelize(model: nn.Module, *, sp_group: Optional[dist.ProcessGroup] = None, sp_mode: str = "ulysses",
                sp_ring_size: Optional[int] = None, sp_auto=None, fused_adaln: bool = False,
                fused_layernorm: bool = False, attention_backend: str = "sdpa", selective_ratio: float = 1.0,
                ac_offload: bool = False, compile: bool = False, compile_backend: Optional[str] = None,
                cuda_graphs: bool = False, lora_rank: int = 0, lora_alpha: float = 16.0, lora_dropout: float = 0.0,
                lora_targets: Optional[Sequence[str]] = None, base_precision: str = "none",
                blocks_to_swap: int = 0) -> ParallelizeReport:
    """Apply LoRA -> base precision -> kernels -> sequence parallelism -> block swapping -> activation
    checkpointing -> compile to ``model`` in place (see the module docstring for why in this order) and
    return what was done.

    Call it on the serial, unwrapped model, once, before the booster plugin wraps it.
    ``compile_backend`` is the ``torch.compile`` backend (None: its default; "eager" for a quick check);
    ``cuda_graphs`` replays the compiled blocks as CUDA graphs (mode "reduce-overhead");
    ``lora_*``: the adapters (rank 0: none; targets None: the model's usual layers); ``base_precision``:
    how the frozen base's linear weights are stored; ``blocks_to_swap``: blocks kept in host memory; ``sp_auto``:
    what ``sp_mode="auto"`` decides from (``opendit_lite.parallel.AutoInputs``; None: the heads alone).

    ``NoiseExperts`` (Wan 2.2's two experts, ``models/experts.py``) gets every step on each expert,
    as if each were the model: each has its own adapters (peft adapters live on the model they are
    injected into), its own sequence-parallel hooks (the family spec places them by path from the
    transformer's root), its base stored in ``base_precision``, its half of ``blocks_to_swap`` swapped
    (the count is of both experts' blocks, as the planner counts them; each expert fetches its own, one
    prefetch chain per expert since a step may run either) and its blocks checkpointed and compiled;
    the report lists both, each row named after its expert."""
    if isinstance(model, NoiseExperts):
        report = ParallelizeReport()
        halves = (blocks_to_swap - blocks_to_swap // 2, blocks_to_swap // 2)
        for (name, expert), swapped in zip(model.experts(), halves):
            part = parallelize(expert, sp_group=sp_group, sp_mode=sp_mode, sp_ring_size=sp_ring_size, sp_auto=sp_auto,
                               fused_adaln=fused_adaln, fused_layernorm=fused_layernorm,
                               attention_backend=attention_backend, selective_ratio=selective_ratio,
                               ac_offload=ac_offload, compile=compile, compile_backend=compile_backend,
                               cuda_graphs=cuda_graphs, lora_rank=lora_rank, lora_alpha=lora_alpha,
                               lora_dropout=lora_dropout, lora_targets=lora_targets, base_precision=base_precision,
                               blocks_to_swap=swapped)
            report.rows += [StepRow(row.step, f"{name}: {row.swapped}", row.count, row.left) for row in part.rows]
            report.conversion = report.conversion or part.conversion
            report.checkpointing = report.checkpointing or part.checkpointing
            report.swap = report.swap or part.swap
        return report
    report = ParallelizeReport()
    # 0. Parameters that get no gradient are frozen first (LoRA leaves the base frozen anyway).
    report.rows += freeze_unused_parameters(model)
    # 0a. LoRA next, on the plain model: every later step keeps the adapter layers.
    report.rows += apply_lora(model, rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout, targets=lora_targets)
    # 0b. The frozen base in low precision, before swapping copies it to the host.
    report.rows += apply_base_precision(model, base_precision=base_precision)
    # 1. Kernels next: the sequence-parallel op wraps whichever attention backend is in place.
    rows, report.conversion = apply_kernels(model, fused_adaln=fused_adaln, fused_layernorm=fused_layernorm,
                                            attention_backend=attention_backend)
    report.rows += rows
    # 2. Sequence parallelism next, so checkpointing and compile see its collectives.
    report.rows += apply_sequence_parallel(model, sp_group=sp_group, sp_mode=sp_mode, sp_ring_size=sp_ring_size,
                                           sp_auto=sp_auto)
    # 2b. Block swapping after every module swap, before checkpointing wraps the swapped forward.
    rows, report.swap = apply_block_swap(model, blocks_to_swap=blocks_to_swap)
    report.rows += rows
    # 3. Checkpointing after every module swap, before compile (the graph holds the recomputation).
    rows, report.checkpointing = apply_activation_checkpointing(model, selective_ratio=selective_ratio,
                                                                offload=ac_offload)
    report.rows += rows
    # 4. Compile last, per block: it traces what each block finally runs.
    report.rows += apply_compile(model, enabled=compile, backend=compile_backend, cuda_graphs=cuda_graphs,
                                 swapped=len(report.swap.swapped) if report.swap is not None else 0)
    return report


__all__ = [
    "ParallelizeReport",
    "SequenceParallelError",
    "StepRow",
    "apply_activation_checkpointing",
    "apply_base_precision",
    "apply_block_swap",
    "apply_compile",
    "apply_kernels",
    "apply_lora",
    "apply_sequence_parallel",
    "freeze_unused_parameters",
    "parallelize",
]
