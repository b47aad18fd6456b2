"""Training precision: the resolved value every layer takes (``policy.py``) and FP8 training of the
blocks' Linear layers (``fp8.py``, torchao)."""

from .fp8 import (
    FP8_MIN_CAPABILITY,
    apply_fp8_training,
    block_linear_filter,
    check_fp8_supported,
    fp8_linear_names,
    has_fp8_linears,
)
from .policy import PRECISION_NAMES, Precision, enable_tf32_matmuls, resolve_precision

__all__ = ["FP8_MIN_CAPABILITY", "PRECISION_NAMES", "Precision", "apply_fp8_training", "block_linear_filter",
           "check_fp8_supported", "enable_tf32_matmuls", "fp8_linear_names", "has_fp8_linears", "resolve_precision"]
