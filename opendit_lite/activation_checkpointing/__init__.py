"""Activation memory: selective activation checkpointing of repeated blocks and CPU offload of
the checkpointed blocks' inputs. Applied from outside the model, like the other training strategies.
"""

from .block_selection import find_checkpoint_blocks, select_blocks
from .offload import ActivationOffloader
from .wrap import CheckpointReport, apply_activation_checkpointing

__all__ = [
    "ActivationOffloader",
    "CheckpointReport",
    "apply_activation_checkpointing",
    "find_checkpoint_blocks",
    "select_blocks",
]
