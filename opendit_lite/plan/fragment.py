"""The planner's answer as a config fragment: the keys to set so that the run fits the device, each
with what it saves (GiB at the predicted peak, against the same plan without it) and what it costs
(step time, the planner's estimate), ready to paste into the config or pass as ``key=value``.

The fragment is YAML the trainers read as it is printed (``tests/plan/test_fit.py`` runs one).
"""

import dataclasses
from typing import Dict, List, Sequence

from .memory_model import GiB
from .planner import Plan, Setting


def peak_bytes(plan: Plan, setting: Setting, activation_gib: Dict[str, float]) -> float:
    """Predicted peak bytes per device of ``setting`` at the plan's batches: states plus the largest bucket's
    activations (``activation_gib``: per sample of each bucket under ``setting``)."""
    states = plan.costs.states(setting)
    return max(states + plan.batches[name] * gib * GiB for name, gib in activation_gib.items())


def _without(plan: Plan, setting: Setting, per_sample, **change) -> float:
    """Peak bytes of the plan with ``change`` undone (e.g. selective_ratio=1.0)."""
    other = dataclasses.replace(setting, **change)
    return peak_bytes(plan, other, per_sample(other))


def _size(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= 0.1 * GiB else f"{nbytes / 2**20:.2f} MiB"


def _pct(x: float) -> str:
    return f"+{100 * x:.1f}%" if x < 0.1 else f"+{100 * x:.0f}%"


def config_fragment(cfg, plan: Plan, per_sample, raw_buckets: Sequence[dict], world_size: int,
                    memory_gib: float) -> str:
    """The fragment for ``plan`` (``plan.costs`` set by ``plan_config``); ``per_sample(setting)``: activation
    GiB per sample of each bucket under a setting; ``raw_buckets``: the config's ``data.buckets`` entries
    (their batch sizes are printed), or empty for one clip/image shape."""
    s, costs = plan.setting, plan.costs
    seconds = costs.seconds(s)
    peak = peak_bytes(plan, s, per_sample(s))
    # Per rank: the weight-memory settings' part and the largest bucket's offloaded activations.
    host = costs.host(s) + max((plan.batches[b.name] * costs.host_per_sample(s, b) for b in costs.buckets),
                               default=0.0)
    node = (f" ({plan.host_gib:.2f} of {plan.host_usable_gib:.2f} GiB usable per node)" if plan.host_gib is not None
            else " (host memory not checked)")

    def saves(**change) -> str:
        return f"saves {_size(_without(plan, s, per_sample, **change) - peak)}"

    lines: List[str] = [
        f"# python -m opendit_lite.plan: set these to fit {memory_gib:g} GiB per device ({world_size} device(s)):",
        f"# predicted peak {_size(peak)} of {_size(plan.usable_gib * GiB)} usable; predicted step time "
        f"{plan.cost:.2f}x that of plain ZeRO-2 without checkpointing; host memory the settings use: "
        f"{_size(host)} per rank{node}.",
    ]
    zero_note = {0: "DDP (fp32 weights, autocast)", 1: "ZeRO-1", 2: "ZeRO-2 (bf16 working weights)",
                 3: "ZeRO-3 (Gemini: weights, gradients and optimizer sharded in chunks)"}[s.zero_degree]
    cost3 = ", +20% step time" if s.zero_degree == 3 else ""
    lines.append(f"zero_degree: {s.zero_degree}          # {zero_note}{cost3}")
    lines.append(f"sp_size: {s.sp_size}" + ("" if s.sp_size == 1 else
                                           f"              # tokens split over {s.sp_size} ranks, "
                                           f"{_pct(0.05 * (s.sp_size.bit_length() - 1))} step time"))
    if s.sp_size > 1 and plan.sp_choice is not None:
        lines.append(f"sp_mode: {plan.sp_choice.mode}")
    if s.selective_ratio < 1:
        lines.append(f"selective_ratio: {s.selective_ratio:g}      # {1 - s.selective_ratio:.0%} of the blocks "
                     f"checkpointed: {saves(selective_ratio=1.0, offload=False)}, "
                     f"{_pct((1 - s.selective_ratio) / 3)} step time (their forward again in backward)")
    else:
        lines.append("selective_ratio: 1        # no block checkpointed")
    if s.offload:
        lines.append(f"ac_offload: true          # checkpointed blocks' inputs in host memory: {saves(offload=False)}"
                     f", +10% step time")
    else:
        lines.append("ac_offload: false")
    memory = []
    if costs.weights.lora:
        swap = seconds["blocks_to_swap"] / seconds["step"]
        memory.append(f"  blocks_to_swap: {s.blocks_to_swap}" + (
            f"        # {s.blocks_to_swap} of {costs.weights.depth} blocks' frozen weights in host memory: "
            f"{saves(blocks_to_swap=0)}, {_pct(swap)} step time (2 x {s.blocks_to_swap} block copies per step "
            f"over PCIe, hidden behind compute but the first of each pass)" if s.blocks_to_swap else ""))
    if s.zero_degree == 3:
        optim = seconds["optim_offload"] / seconds["step"]
        memory.append(f"  gemini_offload_optim_frac: {s.optim_offload:g}" + (
            f"   # that share of the fp32 optimizer states in host memory: {saves(optim_offload=0.0)}, "
            f"{_pct(optim)} step time (CPU Adam, gradients and weights over PCIe)" if s.optim_offload else ""))
    if memory:
        lines += ["memory:", *memory]
    if costs.weights.lora:
        precision = seconds["base_precision"] / seconds["step"]
        lines += ["lora:", f"  base_precision: {s.base_precision}" + (
            f"       # frozen linear weights stored in {s.base_precision}: {saves(base_precision='none')}, "
            f"{_pct(precision)} step time (dequantized for each use)" if s.base_precision != "none" else "")]
    dp = world_size // s.sp_size
    if raw_buckets:
        lines += ["data:", "  buckets:"]
        for raw, (name, batch) in zip(raw_buckets, plan.batches.items()):
            entry = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}"
                              for k, v in {**raw, "batch_size": batch}.items())
            lines.append(f"    - {{{entry}}}")
    else:
        batch = next(iter(plan.batches.values()))
        accum = cfg.grad_accum_steps
        lines.append(f"global_batch_size: {batch * dp * accum}    # batch {batch} per data-parallel rank x {dp} "
                     f"rank(s) x grad_accum_steps {accum}")
    return "\n".join(lines)
