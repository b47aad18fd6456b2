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


def _abort_at_exit_after_the_result(rank, world_size):
    import atexit
    import os

    if rank == 1:
        atexit.register(os.abort)  # SIGABRT at interpreter exit, after the result was saved
    return rank


def test_a_rank_aborting_at_exit_after_its_result_succeeds():
    assert run_distributed(_abort_at_exit_after_the_result, 2, timeout=120) == [0, 1]


def _die_without_a_result(rank, world_size):
    import os

    if rank == 1:
        os._exit(7)  # no record, no traceback
    dist.barrier()


def test_a_rank_dying_without_a_result_fails_the_run():
    import pytest

    with pytest.raises(AssertionError, match=r"rank\(s\) \[1\] exited without a result"):
        run_distributed(_die_without_a_result, 2, timeout=120)
