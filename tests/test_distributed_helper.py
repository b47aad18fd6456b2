import torch
import torch.distributed as dist

from tests.distributed import run_distributed


def _allreduce(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def test_run_distributed_two_ranks():
    assert run_distributed(_allreduce, 2) == [3.0, 3.0]


def _fail_on_rank1(rank, world_size):
    if rank == 1:
        raise RuntimeError("boom on rank 1")
    dist.barrier()  # rank 0 would wait here forever


def test_a_failing_rank_stops_the_others():
    import pytest

    with pytest.raises(AssertionError, match="rank 1 failed"):
        run_distributed(_fail_on_rank1, 2, timeout=120)
