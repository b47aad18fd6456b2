"""Optimizers: AdamW with the EMA update folded into its step (``AdamWEMA``)."""

from .adamw_ema import AdamWEMA

__all__ = ["AdamWEMA"]
