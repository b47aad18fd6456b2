"""The EMA's decay per update, with diffusers' warm-up, and what a decay keeps of a short run.

An EMA that starts from weights about to move far (LoRA adapters, whose ``B`` starts at zero, so
the adapted model starts as the base) lags them by about ``1 / (1 - decay)`` updates: with decay
0.9999 a 300-step LoRA run's EMA holds ~1.5% of what the adapters learned, and an export of it does
nearly nothing. diffusers' ``EMAModel`` warms the decay up instead,

    decay_t = min(decay, (1 + t) / (10 + t))        # t: optimizer steps before this update; 0 when t = 0

(its ``get_decay(t + 1)``), so the first update takes the weights and the next ones follow them
closely (0.18, 0.25, 0.31, ...), and the configured decay only
takes over once ``t`` passes ``(10 * decay - 1) / (1 - decay)`` steps (89991 for 0.9999). The trainers
warm up LoRA runs by default (``ema.warmup``: null), and say what the EMA keeps of the run.

    decay = ema_decay(0.9999, step, warmup=True)     # the decay of the update after ``step`` steps
    kept_fraction(0.9999, 300, warmup=False)         # 0.015: share of a steady change the EMA holds
"""

from typing import Optional

# Below this share of what the weights learned, the EMA's horizon is said to erase the run.
KEPT_WARNING = 0.5


def ema_warmup_on(warmup: Optional[bool], lora_rank: int) -> bool:
    """``ema.warmup`` resolved: null is on for LoRA runs (``lora_rank`` > 0), whose adapters start at
    zero, and off for full training (the EMA starts at the weights it averages)."""
    return bool(lora_rank) if warmup is None else bool(warmup)


def ema_decay(decay: float, step: int, warmup: bool) -> float:
    """The decay of the EMA update made after optimizer step ``step + 1`` (``step`` 0: the first
    update): ``decay``, or with ``warmup`` diffusers' ``EMAModel.get_decay(step + 1)``: 0 for the first
    update, then ``min(decay, (1 + step) / (10 + step))``."""
    if not warmup:
        return decay
    return 0.0 if step <= 0 else min(decay, (1 + step) / (10 + step))


def kept_fraction(decay: float, steps: int, warmup: bool) -> float:
    """What the EMA holds after ``steps`` updates of a change the weights make at a steady rate from
    where the EMA started (weights ``t / steps`` after step t, EMA starting at 0): 1 follows the
    weights exactly, 0 ignores the run. The measure of a decay's horizon against the run's length."""
    ema = 0.0
    for t in range(steps):
        d = ema_decay(decay, t, warmup)
        ema = d * ema + (1 - d) * (t + 1) / steps
    return ema


def ema_horizon_note(decay: float, steps: int, warmup: bool) -> str:
    """One line on what the EMA of a LoRA run keeps of it: a ``warning:`` when under ``KEPT_WARNING``
    (the EMA would erase the training), naming the settings that keep more."""
    kept = kept_fraction(decay, steps, warmup)
    if kept >= KEPT_WARNING:
        how = "warmed up as diffusers' EMAModel, min(decay, (1 + step) / (10 + step))" if warmup else "constant"
        return (f"ema.decay {decay:g} ({how}) over {steps} steps keeps {kept:.0%} of what the adapters learn "
                f"(ema.warmup)")
    better = kept_fraction(decay, steps, warmup=True)
    return (f"warning: ema.decay {decay:g} over {steps} steps keeps {kept:.1%} of what the adapters learned, "
            f"and the EMA weights (the diffusers export with export.ema, sampling with sample.use_ema) carry only "
            f"that: set ema.warmup=true (diffusers' EMAModel warm-up; keeps {better:.0%}), a shorter horizon "
            f"(ema.decay {shorter_decay(steps):g}), or ema.enable=false.")


def shorter_decay(steps: int) -> float:
    """A constant decay whose horizon, ``1 / (1 - decay)``, is a tenth of a run of ``steps`` steps
    (at most 0.999, at least 0.9): it keeps ~90% of a steady change."""
    return round(min(0.999, max(0.9, 1 - 10 / max(steps, 1))), 3)
