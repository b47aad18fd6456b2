"""Sharded exponential moving average of the trainable weights (fp32, sharded like ZeRO's masters):
the shard and its gather/load (``sharded.py``), and its creation and update for a boosted model
(``boosted.py``); the decay of each update, with diffusers' warm-up (``decay.py``)."""

from .boosted import EMASharding, create_sharded_ema, fused_ema_optimizer, update_sharded_ema
from .decay import ema_decay, ema_horizon_note, ema_warmup_on, kept_fraction
from .sharded import ShardedEMA, flat_layout, gemini_layout, zero_layout

__all__ = ["EMASharding", "ShardedEMA", "create_sharded_ema", "ema_decay", "ema_horizon_note", "ema_warmup_on",
           "flat_layout", "fused_ema_optimizer", "gemini_layout", "kept_fraction", "update_sharded_ema", "zero_layout"]
