"""Weight memory: frozen transformer blocks swapped between host and device memory, and frozen base
weights stored in low precision (FP8, NF4) for LoRA runs. Applied from outside the model, like the
other training strategies; activation memory is ``opendit_lite.activation_checkpointing``.
"""

from .block_swap import SwapReport, apply_block_swap, swapped_blocks, swapped_indices
from .copies import CopyCounts, StreamCopier, SyncCopier, copier_for
from .low_precision import BASE_PRECISIONS, LowPrecisionLinear, PrecisionReport, apply_base_precision

__all__ = [
    "BASE_PRECISIONS",
    "LowPrecisionLinear",
    "PrecisionReport",
    "apply_base_precision",
    "CopyCounts",
    "StreamCopier",
    "SwapReport",
    "SyncCopier",
    "apply_block_swap",
    "copier_for",
    "swapped_blocks",
    "swapped_indices",
]
