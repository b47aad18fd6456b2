"""Optimizers and their schedules: AdamW with the EMA update folded into its step (``AdamWEMA``) and
the learning-rate schedules (``lr_schedule.py``: warm-up, then constant, linear or cosine decay)."""

from .adamw_ema import AdamWEMA
from .lr_schedule import build_lr_scheduler, lr_factor

__all__ = ["AdamWEMA", "build_lr_scheduler", "lr_factor"]
