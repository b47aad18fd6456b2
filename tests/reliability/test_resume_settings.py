"""A resumed run applies the config's optimizer settings (not the checkpoint's) and says so."""

import torch

from opendit_lite.optim.lr_schedule import build_lr_scheduler
from opendit_lite.training.hyperparams import apply_configured_hyperparams


def _optimizer_as_saved(lr, weight_decay, steps):
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = build_lr_scheduler(optimizer, schedule="constant", warmup_steps=4, total_steps=100)
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    return optimizer, scheduler


def test_new_lr_and_weight_decay_apply_after_loading_the_old_state():
    old_opt, old_sched = _optimizer_as_saved(1e-3, 0.0, steps=2)
    optimizer, scheduler = _optimizer_as_saved(5e-4, 0.1, steps=0)  # the resumed run, configured anew
    optimizer.load_state_dict(old_opt.state_dict())
    scheduler.load_state_dict(old_sched.state_dict())
    assert optimizer.param_groups[0]["lr"] == 1e-3 * 3 / 4  # the checkpoint's value, mid warm-up
    changes = apply_configured_hyperparams(optimizer, scheduler, lr=5e-4, weight_decay=0.1)
    assert any("lr changed from 0.001 (checkpoint) to 0.0005" in c for c in changes)
    assert any("weight_decay changed from 0 (checkpoint) to 0.1" in c for c in changes)
    assert optimizer.param_groups[0]["lr"] == 5e-4 * 3 / 4  # the new base lr, same warm-up factor
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 5e-4  # warm-up ends at the new lr
    assert apply_configured_hyperparams(optimizer, scheduler, lr=5e-4, weight_decay=0.1) == []
