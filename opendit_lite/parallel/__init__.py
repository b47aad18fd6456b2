"""Sequence parallelism: differentiable collectives, the split/gather boundaries, and one set of
attention ops per (mode, role) applied to a serial model from outside with ``apply_sequence_parallel``
(modes ulysses, ring, usp, auto; roles self, joint, cross, serial) for the model zoo, models following
the attention protocol, timm's and diffusers' attention, and the diffusers families (``diffusers_sp/``);
DSP for spatial-temporal models with ``apply_dsp`` (``dsp.py``). ``opendit_lite.parallelization.parallelize``
calls one of the two.

    ulysses.py   the op interface, Ulysses self/joint ops, the cross op of every mode
    usp.py       ring and USP ops and their process groups; ring.py the ring itself (overlap, backward);
                 ring_kernels.py its log-sum-exp block kernels
    joint.py     the joint-attention layout ([text; video shard]) the joint ops share
    sp_ops.py    the (mode, role) -> op table;  modes.py  head rules, guiding errors, sp_mode=auto
    comm_volume.py  bytes each mode sends per layer and per step (what auto and the planner time)
    sequence_parallel.py  roles of attention module types, the conversion and its report
"""

from .comm import all_to_all, gather_sequence, split_sequence
from .comm_volume import SPWorkload
from .diffusers_sp import FAMILIES, family_spec, register_family_spec
from .dsp import apply_dsp
from .modes import AutoInputs, Links, ModeChoice, decide_sp_mode
from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState
from .sequence_parallel import (
    SEQUENCE_PARALLEL_ATTENTION,
    SequenceParallelReport,
    apply_sequence_parallel,
    attention_roles,
    declared_sp_modes,
    describe_choice,
    make_sequence_parallel,
    register_sequence_parallel_attention,
    resolve_auto,
    sharded_heads,
    sp_workload,
)
from .ulysses import SequenceParallelCrossAttentionOp, SequenceParallelOp, UlyssesAttentionOp, UlyssesJointAttentionOp
from .usp import RingAttentionOp, RingJointAttentionOp, USPAttentionOp, USPGroups, USPJointAttentionOp, build_usp_groups

__all__ = [
    "AutoInputs",
    "FAMILIES",
    "Links",
    "ModeChoice",
    "SPWorkload",
    "attention_roles",
    "decide_sp_mode",
    "resolve_auto",
    "sharded_heads",
    "sp_workload",
    "apply_dsp",
    "all_to_all",
    "build_usp_groups",
    "declared_sp_modes",
    "describe_choice",
    "family_spec",
    "gather_sequence",
    "make_sequence_parallel",
    "register_family_spec",
    "split_sequence",
    "RingAttentionOp",
    "RingJointAttentionOp",
    "SequenceParallelGather",
    "SequenceParallelReport",
    "SequenceParallelSplit",
    "SequenceParallelState",
    "SEQUENCE_PARALLEL_ATTENTION",
    "apply_sequence_parallel",
    "register_sequence_parallel_attention",
    "SequenceParallelCrossAttentionOp",
    "SequenceParallelOp",
    "UlyssesAttentionOp",
    "UlyssesJointAttentionOp",
    "USPAttentionOp",
    "USPGroups",
    "USPJointAttentionOp",
]
