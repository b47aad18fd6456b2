"""Low-precision training beyond bf16: FP8 linears in the transformer blocks (``fp8.py``)."""

from .fp8 import FP8_MIN_CAPABILITY, apply_fp8_training, block_linear_filter, check_fp8_supported, fp8_linear_names

__all__ = ["FP8_MIN_CAPABILITY", "apply_fp8_training", "block_linear_filter", "check_fp8_supported", "fp8_linear_names"]
