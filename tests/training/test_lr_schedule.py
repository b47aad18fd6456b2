"""LR schedules against their closed forms, and a resumed schedule equal to an uninterrupted one."""

import math

import pytest
import torch

from opendit_lite.optim.lr_schedule import build_lr_scheduler

LR, WARMUP, TOTAL, MIN_RATIO = 2e-3, 5, 40, 0.1


def closed_form(schedule: str, step: int) -> float:
    """The LR optimizer step ``step`` (0-based) must use, written out per schedule."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    if schedule == "constant":
        return LR
    p = min(1.0, (step - WARMUP) / (TOTAL - WARMUP))
    if schedule == "linear":
        return LR * (MIN_RATIO + (1 - MIN_RATIO) * (1 - p))
    return LR * (MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * p)))


def make(schedule: str):
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=LR)
    return optimizer, build_lr_scheduler(optimizer, schedule=schedule, warmup_steps=WARMUP, total_steps=TOTAL,
                                         min_lr_ratio=MIN_RATIO)


def used_lrs(optimizer, scheduler, steps: int):
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])  # what optimizer.step() would use now
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_schedule_matches_closed_form(schedule):
    optimizer, scheduler = make(schedule)
    lrs = used_lrs(optimizer, scheduler, TOTAL + 3)  # past the end the decay stays at its floor
    expected = [closed_form(schedule, s) for s in range(TOTAL + 3)]
    assert lrs == pytest.approx(expected, rel=1e-12, abs=1e-15)
    if schedule != "constant":
        assert lrs[WARMUP] == pytest.approx(LR) and lrs[TOTAL] == pytest.approx(LR * MIN_RATIO)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_resumed_schedule_continues_the_curve(schedule):
    optimizer, scheduler = make(schedule)
    uninterrupted = used_lrs(optimizer, scheduler, TOTAL)

    optimizer, scheduler = make(schedule)
    first = used_lrs(optimizer, scheduler, 17)
    state = optimizer.state_dict(), scheduler.state_dict()  # what a checkpoint stores
    optimizer, scheduler = make(schedule)
    optimizer.load_state_dict(state[0])
    scheduler.load_state_dict(state[1])
    assert first + used_lrs(optimizer, scheduler, TOTAL - 17) == pytest.approx(uninterrupted, rel=1e-12)


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="constant, linear, cosine"):
        build_lr_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), schedule="step",
                           warmup_steps=0, total_steps=10)


def test_every_configured_schedule_is_implemented():
    from opendit_lite.config.schema import LR_SCHEDULES
    from opendit_lite.optim.lr_schedule import SCHEDULE_SHAPES

    assert tuple(SCHEDULE_SHAPES) == LR_SCHEDULES
