"""Process groups of the data x sequence mesh, and of grouped (per-node) ZeRO.

Both are the same 2-D split of the world: blocks of ``block_size`` consecutive ranks, and the
"strided" groups that take the rank at the same position in every block.

- Sequence parallelism: a block is one SP group (the ranks that split one sample's tokens, so the
  all-to-alls stay on the fastest links when ``sp_size`` divides the GPUs per node); the strided
  groups are the data-parallel groups (one rank per SP group).
- Grouped ZeRO: a block is one node (ZeRO shards inside it); the strided groups join the ranks
  that hold the same shard on different nodes (they replicate it and average its gradient).

``torch.distributed.new_group`` must be entered by every rank for every group, in the same order,
so each helper creates all groups of its split and keeps the one this rank belongs to. A group
that spans the whole world is the default group itself, not a duplicate communicator.
"""

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


def _new_groups(rank_lists: Sequence[Sequence[int]]) -> ProcessGroup:
    """Create one group per rank list (collectively); return the one containing this rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = None
    for ranks in rank_lists:
        group = dist.group.WORLD if len(ranks) == world else dist.new_group(list(ranks))
        if rank in ranks:
            mine = group
    return mine


def default_node_size(world_size: int) -> int:
    """Ranks per node: torchrun's LOCAL_WORLD_SIZE, else the visible GPUs (at most the world)."""
    env = os.environ.get("LOCAL_WORLD_SIZE")
    return int(env) if env else min(torch.cuda.device_count(), world_size)


def node_group(node_size: Optional[int] = None) -> ProcessGroup:
    """The ranks of this rank's node (blocks of ``node_size`` consecutive ranks, default
    :func:`default_node_size`): where frozen encoders are sharded with ``encoder.group``."""
    node_size = node_size or default_node_size(dist.get_world_size())
    if node_size < 1:  # no LOCAL_WORLD_SIZE and no GPU: one rank per node
        node_size = 1
    return block_groups(node_size)[0]


def block_groups(block_size: int) -> Tuple[ProcessGroup, ProcessGroup]:
    """Split the world into blocks of ``block_size`` consecutive ranks.

    Returns ``(block_group, strided_group)`` for this rank: the ranks of its block, and the ranks
    at its position in every block. ``block_size`` must divide the world size.
    """
    world = dist.get_world_size()
    if block_size < 1 or world % block_size != 0:
        raise ValueError(f"block size {block_size} must be a positive divisor of the world size {world}")
    num_blocks = world // block_size
    blocks: List[List[int]] = [list(range(b * block_size, (b + 1) * block_size)) for b in range(num_blocks)]
    strides: List[List[int]] = [list(range(i, world, block_size)) for i in range(block_size)]
    return _new_groups(blocks), _new_groups(strides)


@dataclass(frozen=True)
class DataSeqMesh:
    """This rank's place in the (dp_size x sp_size) mesh and the groups along each axis.

    ``rank = dp_rank * sp_size + sp_rank``: the ranks of one SP group are consecutive and see the
    same batch; the ranks of one DP group hold different batches.
    """

    dp_size: int
    sp_size: int
    dp_rank: int
    sp_rank: int
    dp_group: ProcessGroup
    sp_group: ProcessGroup


def build_data_seq_mesh(sp_size: int) -> DataSeqMesh:
    """Create the SP groups (consecutive ranks) and DP groups (one rank of each SP group)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if not isinstance(sp_size, int) or sp_size < 1 or world % sp_size != 0:
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        raise ValueError(
            f"sp_size={sp_size!r} must be a positive divisor of the world size {world} "
            f"(allowed: {divisors}); change sp_size or the number of processes"
        )
    sp_group, dp_group = block_groups(sp_size)
    return DataSeqMesh(
        dp_size=world // sp_size, sp_size=sp_size, dp_rank=rank // sp_size, sp_rank=rank % sp_size,
        dp_group=dp_group, sp_group=sp_group,
    )


def cfg_parallel_groups(sp_size: int) -> Tuple[ProcessGroup, ProcessGroup]:
    """The groups of CFG-parallel sampling, where the world is blocks of ``2 x sp_size`` consecutive
    ranks, each block one group of samples: its first ``sp_size`` ranks (one sequence-parallel
    group) compute the conditional branch, the next ``sp_size`` the unconditional one.

    Returns ``(pair_group, block_group)`` for this rank: the two ranks at its position in the two
    halves of its block (they exchange their predictions every step), and its whole block (the
    ranks that must agree on every step-caching decision). ``2 x sp_size`` must divide the world.
    """
    world = dist.get_world_size()
    block = 2 * sp_size
    if sp_size < 1 or world % block != 0:
        raise ValueError(f"CFG-parallel sampling needs a multiple of 2 x sp_size = {block} ranks, got {world}")
    pairs = [[b + s, b + sp_size + s] for b in range(0, world, block) for s in range(sp_size)]
    blocks = [list(range(b, b + block)) for b in range(0, world, block)]
    return _new_groups(pairs), _new_groups(blocks)
