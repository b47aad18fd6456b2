"""A resumed run trains with the optimizer settings of its config, not the checkpoint's.

Loading an optimizer's state also loads its param-group settings, and an LR scheduler's state its
base learning rates, so a new ``lr`` in the config would otherwise be ignored while config.yaml
records it. The new value is applied to both and the change is reported.
"""

from typing import List


def apply_configured_hyperparams(optimizer, lr_scheduler, *, lr: float, weight_decay: float) -> List[str]:
    """Set every param group's base ``lr`` and ``weight_decay`` to the configured values, keeping the
    scheduler's current factor (warm-up, decay) on the lr; returns one message per changed setting."""
    changes = []
    base_lrs = (list(getattr(lr_scheduler, "base_lrs", []))
                or [g.get("initial_lr", g["lr"]) for g in optimizer.param_groups])
    old_lr = base_lrs[0]
    if old_lr != lr:
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["lr"] = group["lr"] * (lr / base) if base else lr
            group["initial_lr"] = lr
        if lr_scheduler is not None and hasattr(lr_scheduler, "base_lrs"):
            lr_scheduler.base_lrs = [lr] * len(lr_scheduler.base_lrs)
            lr_scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
        changes.append(f"lr changed from {old_lr:g} (checkpoint) to {lr:g} (config): the new value applies from now on")
    old_wd = optimizer.param_groups[0].get("weight_decay")
    if old_wd is not None and old_wd != weight_decay:
        for group in optimizer.param_groups:
            group["weight_decay"] = weight_decay
        changes.append(f"weight_decay changed from {old_wd:g} (checkpoint) to {weight_decay:g} (config): "
                       f"the new value applies from now on")
    return changes
