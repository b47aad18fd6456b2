"""The planner: per-bucket batch sizes and the run's memory settings for a device of a given size.

For every candidate setting (zero_degree, sp_size, selective_ratio, offload) the memory model
(``memory_model.py``) gives the bytes per device of model states + EMA shard and, per bucket, of
activations per sample; a bucket's batch is the largest whose total stays within the usable memory
(device memory less a reserve for the CUDA context, allocator fragmentation and temporaries). Among
the settings that give every bucket a batch of at least ``min_batch``, the planner picks the one of
lowest estimated cost per sample, from these assumptions (printed with every plan):

* ZeRO-2 communicates as much as DDP's all-reduce (reduce-scatter + all-gather) and shards the
  optimizer and gradients: cost 1.0; ZeRO-1 1.0 too but keeps full gradients; ZeRO-3 re-gathers
  weights every step: +20%.
* Checkpointing a fraction c of the blocks recomputes their forward: +c/3 (forward is a third of a step).
* Offloading checkpointed inputs: +10% (host transfers only partly overlapped).
* Sequence parallelism over P ranks: +5% per doubling, for P dividing the world size at which some mode
  runs (``plan_config`` passes them; the mode itself, ulysses, ring, usp or dsp, is ``sp_mode: auto``'s
  choice, timed from the bytes of ``parallel/comm_volume.py``).

Ties go to the setting listed first (smaller SP, less recompute, no offload, lower ZeRO degree).

Host memory (``HostBudget``, when given): what a setting puts in one node's host memory (swapped
blocks, the original weights a low-precision base keeps, Gemini's offloaded optimizer states: a fixed
amount per rank; offloaded activations: per sample) times the ranks on the node must stay within the
usable host memory; a bucket's batch is capped by it too, and a setting that cannot hold even its
fixed part is skipped. A setting that puts nothing on the host is never refused for it.
"""

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..builders.geometry import LatentBucket
from ..parallel.modes import ModeChoice
from .memory_model import GiB, ModelShape, activation_bytes, sample_tokens, step_bytes

RATIOS = (1.0, 0.75, 0.5, 0.25, 0.0)   # selective_ratio candidates (fraction of blocks NOT checkpointed)


@dataclass(frozen=True)
class Setting:
    zero_degree: int
    sp_size: int
    selective_ratio: float
    offload: bool
    blocks_to_swap: int = 0        # memory.blocks_to_swap (LoRA runs)
    base_precision: str = "none"   # lora.base_precision
    optim_offload: float = 0.0     # memory.gemini_offload_optim_frac (zero_degree 3)

    def cost(self) -> float:
        """Estimated time per sample relative to plain ZeRO-2 (the module docstring's assumptions)."""
        c = 1.0 + (0.2 if self.zero_degree == 3 else 0.0)
        c += (1.0 - self.selective_ratio) / 3 + (0.1 if self.offload else 0.0)
        return c + 0.05 * math.log2(self.sp_size)


@dataclass(frozen=True)
class HostBudget:
    """One node's host memory that the settings may use (the module docstring): ``usable_gib`` for
    ``ranks`` ranks, each needing ``fixed(setting)`` bytes plus ``per_sample(setting, bucket)`` per sample."""

    usable_gib: float
    ranks: int
    fixed: Callable[[Setting], float]
    per_sample: Callable[[Setting, LatentBucket], float]

    def spare_per_rank(self, setting: Setting) -> float:
        """Bytes per rank left for offloaded activations once ``setting``'s fixed part is held."""
        return self.usable_gib * GiB / self.ranks - self.fixed(setting)

    def capped(self, setting: Setting, buckets: Sequence[LatentBucket], batches: Dict[str, int]) -> Dict[str, int]:
        """``batches`` capped by what the host holds (every batch 0 when not even the fixed part fits; unchanged
        when the setting puts nothing on the host)."""
        fixed, spare = self.fixed(setting), self.spare_per_rank(setting)
        capped = {}
        for b in buckets:
            on_host = self.per_sample(setting, b)
            if fixed and spare < 0:
                capped[b.name] = 0
            elif on_host:  # offloaded activations: the batch the host holds too
                capped[b.name] = min(batches[b.name], max(0, int(spare // on_host)))
            else:
                capped[b.name] = batches[b.name]
        return capped

    def need_gib(self, setting: Setting, buckets: Sequence[LatentBucket], batches: Dict[str, int]) -> float:
        """The node's host GiB under ``setting`` at ``batches`` (the largest bucket's activations: buckets
        take turns)."""
        activations = max((batches[b.name] * self.per_sample(setting, b) for b in buckets), default=0.0)
        return self.ranks * (self.fixed(setting) + activations) / GiB


@dataclass
class Plan:
    setting: Setting
    batches: Dict[str, int]                    # bucket name -> batch per data-parallel rank
    states_gib: float                          # model states + EMA shard per device
    activation_gib_per_sample: Dict[str, float]
    usable_gib: float
    assumptions: List[str] = field(default_factory=list)
    sp_choice: Optional[ModeChoice] = None     # the mode sp_mode=auto takes at the plan's sp_size, and why
    sp_requested: str = "auto"                 # the config's sp_mode
    cost: float = 0.0                          # estimated time per sample relative to plain ZeRO-2
    costs: Optional[object] = None             # plan.Costs of the run (weight bytes, step-time shares), if known
    host_gib: Optional[float] = None           # host memory of one node the settings use (None: not checked)
    host_usable_gib: Optional[float] = None    # of the node's usable host memory

    def sp_text(self) -> str:
        """The SP mode of the plan and why (one paragraph)."""
        if self.sp_choice is None:
            return "off (sp_size=1)"
        text = f"{self.sp_choice.describe(self.setting.sp_size)}. {self.sp_choice.reason}"
        if self.sp_requested not in ("auto", self.sp_choice.mode):
            text += (f" The config asks sp_mode={self.sp_requested}; sp_mode=auto (or "
                     f"sp_mode={self.sp_choice.mode}) takes this choice.")
        return text

    def table(self, buckets: Sequence[LatentBucket], shape: ModelShape) -> str:
        s = self.setting
        mode = self.sp_choice.describe(s.sp_size) if self.sp_choice else "off"
        memory = (f" blocks_to_swap={s.blocks_to_swap} base_precision={s.base_precision}"
                  + (f" gemini_offload_optim_frac={s.optim_offload:g}" if s.optim_offload else ""))
        lines = [f"model {shape.name}: {shape.params / 1e6:.1f}M parameters, depth {shape.depth}, width "
                 f"{shape.hidden_size}, {shape.num_heads} heads",
                 f"run: zero_degree={s.zero_degree} sp_size={s.sp_size} sp_mode={mode} "
                 f"selective_ratio={s.selective_ratio:g} offload={str(s.offload).lower()}{memory}  (estimated cost "
                 f"{self.cost or s.cost():.2f}x)",
                 f"sequence parallel: {self.sp_text()}",
                 f"memory per device: {self.usable_gib:.2f} GiB usable, model states + EMA {self.states_gib:.2f} GiB",
                 *([f"host memory per node: {self.host_gib:.2f} GiB of {self.host_usable_gib:.2f} GiB usable (swapped "
                    f"blocks, kept originals, offloaded optimizer states and activations)"]
                   if self.host_gib is not None else []),
                 f"{'bucket':<20} {'latent TxHxW':>14} {'tokens/rank':>12} {'GiB/sample':>11} {'batch':>6} "
                 f"{'predicted GiB':>14}"]
        for b in buckets:
            per = self.activation_gib_per_sample[b.name]
            tokens = -(-sample_tokens(shape, b.frames, b.height, b.width, b.extra_tokens) // s.sp_size)
            batch = self.batches[b.name]
            lines.append(f"{b.name:<20} {f'{b.frames}x{b.height}x{b.width}':>14} {tokens:>12} {per:>11.3f} "
                         f"{batch:>6} {self.states_gib + per * batch:>14.2f}")
        lines.append("assumptions:")
        lines += [f"  - {a}" for a in self.assumptions]
        return "\n".join(lines)


@dataclass(frozen=True)
class MemoryOptions:
    """The weight-memory settings a run may take: block swap counts and base precisions (LoRA runs),
    Gemini optimizer-offload fractions (full fine-tunes under zero_degree 3), and the ZeRO degrees."""

    blocks_to_swap: Sequence[int] = (0,)
    base_precisions: Sequence[str] = ("none",)
    optim_offloads: Sequence[float] = (0.0,)
    zero_degrees: Optional[Sequence[int]] = None   # None: candidate_settings' default


def candidate_settings(world_size: int, num_heads: int, zero_degrees: Sequence[int] = (2, 1, 0, 3),
                       sp_sizes: Optional[Sequence[int]] = None,
                       options: Optional[MemoryOptions] = None) -> List[Setting]:
    """Every setting the planner considers, cheapest first (ties keep this order). One device has nothing
    to shard: only zero_degree 0 and sp_size 1 unless ``options`` lists degrees; SP sizes divide the world
    size. ``options``: the weight-memory settings to combine with them (none by default)."""
    options = options or MemoryOptions()
    if options.zero_degrees is not None:
        zero_degrees = options.zero_degrees
    elif world_size == 1:
        zero_degrees = (0,)
    if sp_sizes is None:
        sp_sizes = [p for p in (1, 2, 4, 8, 16, 32) if world_size % p == 0 and num_heads % p == 0]
    settings = [Setting(z, p, r, o, n, b, f) for p in sp_sizes for r in RATIOS
                for o in ((False, True) if r < 1 else (False,)) for z in zero_degrees
                for b in options.base_precisions for n in options.blocks_to_swap
                for f in (options.optim_offloads if z == 3 else (0.0,))]
    return sorted(settings, key=lambda s: s.cost())  # stable: ties keep the listed order


def bucket_batch(shape: ModelShape, bucket: LatentBucket, setting: Setting, usable: float, world_size: int,
                 element_bytes: int, caption_tokens: int, max_batch: int,
                 states: Optional[float] = None) -> Tuple[int, float]:
    """(largest batch that fits ``usable`` bytes, activation bytes per sample) for one bucket; ``states``:
    the bytes of weights, gradients, optimizer and EMA per device (None: a full fine-tune's ZeRO formulas)."""
    per_sample = activation_bytes(shape, bucket.frames, bucket.height, bucket.width, 1, element_bytes,
                                  setting.sp_size, setting.selective_ratio, setting.offload, caption_tokens,
                                  bucket.extra_tokens)
    if states is None:
        states = step_bytes(shape, setting.zero_degree, world_size)
    return max(0, min(max_batch, int((usable - states) // per_sample))), per_sample


def plan(shape: ModelShape, buckets: Sequence[LatentBucket], memory_gib: float, world_size: int,
         element_bytes: int = 2, caption_tokens: int = 0, reserve_gib: float = 1.0, reserve_fraction: float = 0.1,
         min_batch: int = 1, max_batch: int = 256, settings: Optional[Sequence[Setting]] = None,
         sp_sizes: Optional[Sequence[int]] = None, options: Optional[MemoryOptions] = None,
         states: Optional[Callable[[Setting], float]] = None,
         extra_cost: Optional[Callable[[Setting], float]] = None, host: Optional[HostBudget] = None) -> Plan:
    """The cheapest setting under which every bucket fits ``min_batch``; raises ValueError when none does.
    ``sp_sizes``: the SP sizes to consider (None: those dividing the world size and the heads);
    ``options``: the weight-memory settings to consider too; ``states``: bytes per device of a setting's
    weights, gradients, optimizer and EMA (None: a full fine-tune's ZeRO formulas, ``step_bytes``);
    ``extra_cost``: a setting's cost beyond ``Setting.cost`` (swapping, low-precision storage, offload);
    ``host``: the node's host memory the settings may use (None: not checked)."""
    states = states or (lambda s: step_bytes(shape, s.zero_degree, world_size))
    extra_cost = extra_cost or (lambda s: 0.0)
    usable = memory_gib * GiB * (1 - reserve_fraction) - reserve_gib * GiB
    assumptions = [
        f"usable memory = {memory_gib:g} GiB x {1 - reserve_fraction:g} - {reserve_gib:g} GiB (CUDA context, "
        f"allocator fragmentation, temporaries of the step)",
        f"activations in {element_bytes}-byte elements; per-block saved widths per token: "
        f"{shape.profile.token_widths:.4g} x D (+{shape.profile.caption_widths_per_frame:.4g} x D per caption token "
        f"and frame, +{shape.profile.caption_widths:.4g} x D per caption token), {shape.profile.source}; "
        f"SDPA/flash attention (no N x N scores kept)",
        "model states: ZeRO formulas with Adam (K=12) sharded over the whole world; fp32 EMA sharded too",
        "cost per sample: ZeRO-3 +20%, checkpointing a fraction c of blocks +c/3, offload +10%, "
        "SP +5% per doubling; the cheapest setting that fits every bucket wins",
    ]
    if host is not None:
        assumptions.append(f"host memory: {host.usable_gib:.1f} GiB usable for {host.ranks} rank(s) per node holds "
                           f"the swapped blocks, the originals of a low-precision base, Gemini's offloaded optimizer "
                           f"states and offloaded activations; the model's weights read at start-up are not counted")
    candidates = settings or candidate_settings(world_size, shape.num_heads, sp_sizes=sp_sizes, options=options)
    short_of_host = 0  # settings that fit the device but not the host
    for setting in sorted(candidates, key=lambda s: s.cost() + extra_cost(s)):  # stable: ties keep the order
        batches, per_sample = {}, {}
        held = states(setting)
        for b in buckets:
            batches[b.name], per_sample[b.name] = bucket_batch(shape, b, setting, usable, world_size, element_bytes,
                                                               caption_tokens, max_batch, held)
        if min(batches.values()) < min_batch:
            continue
        if host is not None:
            batches = host.capped(setting, buckets, batches)
            if min(batches.values()) < min_batch:
                short_of_host += 1
                continue
        return Plan(setting, batches, held / GiB, {k: v / GiB for k, v in per_sample.items()}, usable / GiB,
                    assumptions, cost=setting.cost() + extra_cost(setting),
                    host_gib=host.need_gib(setting, buckets, batches) if host is not None else None,
                    host_usable_gib=host.usable_gib if host is not None else None)
    host_text = (f"; {short_of_host} setting(s) that fit the device need more than the {host.usable_gib:.1f} GiB of "
                 f"host memory usable per node (--host-memory)" if short_of_host else "")
    raise ValueError(f"no setting fits a batch of {min_batch} of every bucket in {memory_gib:g} GiB per device "
                     f"at world size {world_size}{host_text}: use more devices, smaller buckets or a larger device")


# Device memory sizes (GiB) of common training GPUs, for "the smallest card that would fit".
CARDS = (8, 12, 16, 24, 32, 40, 48, 80, 94, 141, 192)


def smallest_card(plan_at: Callable[[float], Plan], tried_gib: float) -> str:
    """"the smallest device that fits is N GiB" for the first of ``CARDS`` above ``tried_gib`` at which
    ``plan_at(gib)`` finds a setting ("" when none does)."""
    for gib in CARDS:
        if gib <= tried_gib:
            continue
        try:
            found = plan_at(gib)
        except ValueError:
            continue
        return f"the smallest device that fits is {gib} GiB (the planner's choice there: " \
               f"{_settings_text(found.setting)})"
    return ""


def _settings_text(s: Setting) -> str:
    text = f"zero_degree={s.zero_degree} sp_size={s.sp_size} selective_ratio={s.selective_ratio:g} " \
           f"ac_offload={str(s.offload).lower()}"
    if s.blocks_to_swap or s.base_precision != "none":
        text += f" memory.blocks_to_swap={s.blocks_to_swap} lora.base_precision={s.base_precision}"
    if s.optim_offload:
        text += f" memory.gemini_offload_optim_frac={s.optim_offload:g}"
    return text
