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
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..builders.geometry import LatentBucket
from ..parallel.modes import ModeChoice
from .memory_model import GiB, ModelShape, activation_bytes, step_bytes

RATIOS = (1.0, 0.75, 0.5, 0.25, 0.0)   # selective_ratio candidates (fraction of blocks NOT checkpointed)


@dataclass(frozen=True)
class Setting:
    zero_degree: int
    sp_size: int
    selective_ratio: float
    offload: bool

    def cost(self) -> float:
        """Estimated time per sample relative to plain ZeRO-2 (the module docstring's assumptions)."""
        c = 1.0 + (0.2 if self.zero_degree == 3 else 0.0)
        c += (1.0 - self.selective_ratio) / 3 + (0.1 if self.offload else 0.0)
        return c + 0.05 * math.log2(self.sp_size)


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
        lines = [f"model {shape.name}: {shape.params / 1e6:.1f}M parameters, depth {shape.depth}, width "
                 f"{shape.hidden_size}, {shape.num_heads} heads",
                 f"run: zero_degree={s.zero_degree} sp_size={s.sp_size} sp_mode={mode} "
                 f"selective_ratio={s.selective_ratio:g} offload={str(s.offload).lower()}  (estimated cost "
                 f"{s.cost():.2f}x)",
                 f"sequence parallel: {self.sp_text()}",
                 f"memory per device: {self.usable_gib:.2f} GiB usable, model states + EMA {self.states_gib:.2f} GiB",
                 f"{'bucket':<20} {'latent TxHxW':>14} {'tokens/rank':>12} {'GiB/sample':>11} {'batch':>6} "
                 f"{'predicted GiB':>14}"]
        for b in buckets:
            per = self.activation_gib_per_sample[b.name]
            tokens = -(-(-(-b.frames // shape.patch_size[0]) * (b.height // shape.patch_size[1])
                         * (b.width // shape.patch_size[2])) // s.sp_size)
            batch = self.batches[b.name]
            lines.append(f"{b.name:<20} {f'{b.frames}x{b.height}x{b.width}':>14} {tokens:>12} {per:>11.3f} "
                         f"{batch:>6} {self.states_gib + per * batch:>14.2f}")
        lines.append("assumptions:")
        lines += [f"  - {a}" for a in self.assumptions]
        return "\n".join(lines)


def candidate_settings(world_size: int, num_heads: int, zero_degrees: Sequence[int] = (2, 1, 0, 3),
                       sp_sizes: Optional[Sequence[int]] = None) -> List[Setting]:
    """Every setting the planner considers, cheapest first (ties keep this order). One device has nothing
    to shard: only zero_degree 0 and sp_size 1; SP sizes divide the world size."""
    if world_size == 1:
        zero_degrees = (0,)
    if sp_sizes is None:
        sp_sizes = [p for p in (1, 2, 4, 8, 16, 32) if world_size % p == 0 and num_heads % p == 0]
    settings = [Setting(z, p, r, o) for p in sp_sizes for r in RATIOS for o in ((False, True) if r < 1 else (False,))
                for z in zero_degrees]
    return sorted(settings, key=lambda s: s.cost())  # stable: ties keep the listed order


def bucket_batch(shape: ModelShape, bucket: LatentBucket, setting: Setting, usable: float, world_size: int,
                 element_bytes: int, caption_tokens: int, max_batch: int) -> Tuple[int, float]:
    """(largest batch that fits ``usable`` bytes, activation bytes per sample) for one bucket."""
    per_sample = activation_bytes(shape, bucket.frames, bucket.height, bucket.width, 1, element_bytes,
                                  setting.sp_size, setting.selective_ratio, setting.offload, caption_tokens)
    free = usable - step_bytes(shape, setting.zero_degree, world_size)
    return max(0, min(max_batch, int(free // per_sample))), per_sample


def plan(shape: ModelShape, buckets: Sequence[LatentBucket], memory_gib: float, world_size: int,
         element_bytes: int = 2, caption_tokens: int = 0, reserve_gib: float = 1.0, reserve_fraction: float = 0.1,
         min_batch: int = 1, max_batch: int = 256, settings: Optional[Sequence[Setting]] = None,
         sp_sizes: Optional[Sequence[int]] = None) -> Plan:
    """The cheapest setting under which every bucket fits ``min_batch``; raises ValueError when none does.
    ``sp_sizes``: the SP sizes to consider (None: those dividing the world size and the heads)."""
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
    for setting in settings or candidate_settings(world_size, shape.num_heads, sp_sizes=sp_sizes):
        batches, per_sample = {}, {}
        for b in buckets:
            batches[b.name], per_sample[b.name] = bucket_batch(shape, b, setting, usable, world_size, element_bytes,
                                                               caption_tokens, max_batch)
        if min(batches.values()) >= min_batch:
            return Plan(setting, batches, step_bytes(shape, setting.zero_degree, world_size) / GiB,
                        {k: v / GiB for k, v in per_sample.items()}, usable / GiB, assumptions)
    raise ValueError(f"no setting fits a batch of {min_batch} of every bucket in {memory_gib:g} GiB per device "
                     f"at world size {world_size}: use more devices, smaller buckets or a larger device")
