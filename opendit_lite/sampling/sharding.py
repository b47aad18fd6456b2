"""Where each process samples: the data x (guidance branch) x sequence mesh of a sampling run, this
rank's block of sample indices, and the gather of finished samples on rank 0."""

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from ..config import ConfigError
from ..distributed.mesh import build_data_seq_mesh, cfg_parallel_groups
from ..distributed.process_group import cleanup_distributed, init_distributed


@dataclass(frozen=True)
class SamplingRanks:
    """This process's place in a sampling run: ``rank = (dp_rank * cfg_size + cfg_rank) * sp_size +
    sp_rank`` (as in training when ``cfg_size`` is 1). With CFG-parallel sampling (``cfg_size`` 2)
    the sequence-parallel group ``cfg_rank`` 0 computes guidance's conditional branch and its twin
    ``cfg_rank`` 1 the unconditional one, for the same samples."""

    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    sp_rank: int
    sp_size: int
    sp_group: Optional[dist.ProcessGroup]
    device: torch.device
    cfg_rank: int = 0
    cfg_size: int = 1
    cfg_group: Optional[dist.ProcessGroup] = None    # this rank and its twin in the other branch
    batch_group: Optional[dist.ProcessGroup] = None  # every rank that works on this rank's samples

    @property
    def is_main(self) -> bool:
        """Rank 0: shows progress and writes the outputs."""
        return self.rank == 0

    @property
    def holds_result(self) -> bool:
        """The first rank of each group of samples hands its samples to rank 0 (its sequence-parallel
        peers and its twin in the other guidance branch hold the same ones)."""
        return self.sp_rank == 0 and self.cfg_rank == 0

    @property
    def samples_size(self) -> int:
        """The ranks that work on one group of samples (``batch_group``'s size)."""
        return self.cfg_size * self.sp_size

    def shard(self, num_samples: int) -> range:
        """This rank's contiguous block of the global sample indices 0..num_samples-1; the first
        ``num_samples % dp_size`` data-parallel ranks take one more."""
        base, extra = divmod(num_samples, self.dp_size)
        start = self.dp_rank * base + min(self.dp_rank, extra)
        return range(start, start + base + (self.dp_rank < extra))

    def batches(self, num_samples: int, batch_size: int) -> Iterator[range]:
        """This rank's block of the global sample indices (``shard``) in batches of up to
        ``batch_size`` indices; rank 0 shows a bar over the batches when there are several."""
        block = self.shard(num_samples)
        starts = range(block.start, block.stop, batch_size)
        if self.is_main and len(starts) > 1:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc=f"sampling (rank 0: {len(block)} of {num_samples})", unit="batch")
        for start in starts:
            yield range(start, min(start + batch_size, block.stop))


def _single_process() -> SamplingRanks:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return SamplingRanks(0, 1, 0, 1, 0, 1, None, device)


@contextmanager
def sampling_ranks(sp_size: int, cfg_parallel: bool = False) -> Iterator[SamplingRanks]:
    """The sampling mesh for this launch. A plain ``python`` run (or a single torchrun rank) needs
    no process group; otherwise the default group is started (or reused, if the caller started
    one) and the data x sequence groups are built, and with ``cfg_parallel`` the pairs of ranks
    that compute guidance's two branches. Groups this call started are torn down at exit."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if sp_size < 1 or world % sp_size != 0:
        raise ConfigError(f"'sp_size'={sp_size} must be a positive divisor of the number of ranks ({world}); "
                          f"choose one of {[d for d in range(1, world + 1) if world % d == 0]}.")
    if cfg_parallel and world % (2 * sp_size) != 0:
        raise ConfigError(f"'sample.cfg_parallel' runs guidance's conditional and unconditional branches on two "
                          f"groups of sp_size={sp_size} ranks each, so the number of ranks must be a multiple of "
                          f"2 x {sp_size} = {2 * sp_size}; this launch has {world}. Launch "
                          f"{max(2 * sp_size, world // (2 * sp_size) * 2 * sp_size)} ranks (torchrun "
                          f"--nproc_per_node), halve sp_size, or set sample.cfg_parallel=false.")
    if world == 1:
        yield _single_process()
        return
    started = not dist.is_initialized()
    info = init_distributed()
    try:
        mesh = build_data_seq_mesh(sp_size)
        if cfg_parallel:
            cfg_group, batch_group = cfg_parallel_groups(sp_size)
            block = info.rank // (2 * sp_size)
            yield SamplingRanks(info.rank, info.world_size, block, world // (2 * sp_size), mesh.sp_rank,
                                mesh.sp_size, mesh.sp_group, info.device, cfg_rank=(info.rank // sp_size) % 2,
                                cfg_size=2, cfg_group=cfg_group, batch_group=batch_group)
        else:
            yield SamplingRanks(info.rank, info.world_size, mesh.dp_rank, mesh.dp_size, mesh.sp_rank, mesh.sp_size,
                                mesh.sp_group, info.device, batch_group=mesh.sp_group if sp_size > 1 else None)
    finally:
        if started:
            cleanup_distributed()


def gather_on_main(local: torch.Tensor, ranks: SamplingRanks) -> Optional[torch.Tensor]:
    """Every rank's block of samples [n_rank, ...] -> all samples [N, ...] in index order on rank 0
    (None elsewhere). Called by every rank; blocks travel through the CPU."""
    if ranks.world_size == 1:
        return local.cpu()
    mine = local.cpu() if ranks.holds_result else None
    blocks = [None] * ranks.world_size if ranks.is_main else None
    dist.gather_object(mine, blocks, dst=0)
    if not ranks.is_main:
        return None
    return torch.cat([b for b in blocks if b is not None and len(b)])  # rank order = index order
