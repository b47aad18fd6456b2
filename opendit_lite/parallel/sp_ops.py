"""One table of sequence-parallel attention ops per (mode, role), used by our models' ``attn_op`` wrapping
(``sequence_parallel.py``) and by the diffusers families' attention (``diffusers_sp/``) alike.

=========  ============================  ============================  ==================================
role       ulysses                       ring                          usp (ring R x Ulysses U)
=========  ============================  ============================  ==================================
self       ``UlyssesAttentionOp``        ``RingAttentionOp``           ``USPAttentionOp``
joint      ``UlyssesJointAttentionOp``   ``RingJointAttentionOp``      ``USPJointAttentionOp``
cross      ``SequenceParallelCrossAttentionOp`` (local: queries sharded, context replicated)
serial     the op stays as it is (an axis that is not sharded, or text-only attention)
=========  ============================  ============================  ==================================

USP with ``R == 1`` is Ulysses and with ``R == sp_size`` the plain ring: those get the Ulysses or ring
ops (no extra process groups; Ulysses keeps the backend's own kernel). The op interface is documented
in ``ulysses.py``.
"""

import functools
from typing import Callable, Optional

import torch.distributed as dist

from opendit_lite.models.layers.attention import AttentionOp

from .modes import ModeChoice
from .sequence import SequenceParallelState
from .ulysses import SequenceParallelCrossAttentionOp, SequenceParallelOp, UlyssesAttentionOp, UlyssesJointAttentionOp
from .usp import (
    RingAttentionOp,
    RingJointAttentionOp,
    USPAttentionOp,
    USPGroups,
    USPJointAttentionOp,
    build_usp_groups,
)

SPOpFactory = Callable[[AttentionOp, SequenceParallelState], SequenceParallelOp]

_OPS = {
    ("ulysses", "self"): UlyssesAttentionOp, ("ulysses", "joint"): UlyssesJointAttentionOp,
    ("ring", "self"): RingAttentionOp, ("ring", "joint"): RingJointAttentionOp,
    ("usp", "self"): USPAttentionOp, ("usp", "joint"): USPJointAttentionOp,
}


def effective_mode(choice: ModeChoice, sp_size: int) -> str:
    """The op family that runs: USP with a ring of 1 is Ulysses, with a ring of sp_size the plain ring."""
    if choice.mode == "usp" and choice.ring_size == 1:
        return "ulysses"
    if choice.mode == "usp" and choice.ring_size == sp_size:
        return "ring"
    return choice.mode


def build_groups(choice: ModeChoice, sp_group: Optional[dist.ProcessGroup], sp_size: int) -> Optional[USPGroups]:
    """The USP process groups a choice needs (None for Ulysses and ring). Collective over the world:
    call it on every rank, once per conversion, before any module is converted."""
    if effective_mode(choice, sp_size) != "usp":
        return None
    return build_usp_groups(sp_group, choice.ring_size)


def op_factory(choice: ModeChoice, role: str, sp_size: int, groups: Optional[USPGroups]) -> Optional[SPOpFactory]:
    """``factory(inner, state)`` of the op for ``role`` under ``choice``; None keeps the op serial."""
    if role == "serial":
        return None
    if role == "cross":
        return SequenceParallelCrossAttentionOp
    mode = effective_mode(choice, sp_size)
    op = _OPS[(mode, role)]
    return functools.partial(op, groups=groups) if mode == "usp" else op
