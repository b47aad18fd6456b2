"""Which of a model's repeated blocks to checkpoint. The blocks themselves come from
``opendit_lite.models.blocks.find_blocks`` (declared by the model or detected), re-exported here as
``find_checkpoint_blocks``.
"""

import math
from typing import List

from ..models.blocks import find_blocks as find_checkpoint_blocks

__all__ = ["find_checkpoint_blocks", "select_blocks"]

# Ratios written in decimal are not exact in binary (0.29 * 100 = 28.999...); this tolerance
# makes such a product count the number of blocks it was written to mean.
_RATIO_TOLERANCE = 1e-9


def select_blocks(num_blocks: int, selective_ratio: float) -> List[int]:
    """Indices of the blocks to checkpoint when a fraction ``selective_ratio`` of them is not.

    ``k = floor(selective_ratio * num_blocks)`` blocks are left out, spread evenly over depth:
    the depth is cut into ``k`` equal segments and the block at the middle of each is left out,
    i.e. indices ``((2j + 1) * num_blocks) // (2k)`` for ``j < k``. Rounding down leaves out at
    most the requested fraction, so memory never exceeds what was asked for. For 28 blocks:

    * ratio 0: all 28 checkpointed;
    * ratio 0.25: 7 left out, 2, 6, 10, ..., 26 (every fourth, starting at the middle of the
      first four), the other 21 checkpointed;
    * ratio 0.5: 14 left out, the odd indices; the even ones 0, 2, ..., 26 are checkpointed;
    * ratio 1: none checkpointed.
    """
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
        raise ValueError(f"num_blocks must be a non-negative integer, got {num_blocks!r}")
    if isinstance(selective_ratio, bool) or not isinstance(selective_ratio, (int, float)) \
            or not 0.0 <= selective_ratio <= 1.0:
        raise ValueError(f"selective_ratio is the fraction of blocks NOT checkpointed and must be in [0, 1] "
                         f"(0: all checkpointed, 1: none), got {selective_ratio!r}")
    skipped_count = math.floor(selective_ratio * num_blocks + _RATIO_TOLERANCE)
    skipped = {((2 * j + 1) * num_blocks) // (2 * skipped_count) for j in range(skipped_count)}
    return [i for i in range(num_blocks) if i not in skipped]
