"""Sharded exponential moving average of the trainable weights (fp32, sharded like ZeRO's masters)."""

from .sharded import ShardedEMA, flat_layout, gemini_layout, zero_layout

__all__ = ["ShardedEMA", "flat_layout", "gemini_layout", "zero_layout"]
