"""The trainer's state as one object: what ``TrainState`` writes into a checkpoint's extra state
and reads back, and the batch streams' positions, restored into a stream built beforehand."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from opendit_lite.data.buckets import Bucket, BucketBatches, BucketBatchSampler
from opendit_lite.data.resumable_sampler import ResumableBatches, ResumableDistributedSampler
from opendit_lite.training.state import TrainState


def image_stream() -> ResumableBatches:
    data = TensorDataset(torch.arange(10))
    sampler = ResumableDistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3, drop_last=True)
    return ResumableBatches(DataLoader(data, batch_size=2, sampler=sampler, drop_last=True), micro_batch=2)


class IndexOf(torch.utils.data.Dataset):
    def __getitem__(self, item):
        return item[0]


def bucket_stream() -> BucketBatches:
    shapes = [(1, 8, 8)] * 6 + [(2, 8, 8)] * 6
    buckets = [Bucket("image", 1, 8, 8, batch_size=2), Bucket("clip", 2, 8, 8, batch_size=3)]
    sampler = BucketBatchSampler(buckets, shapes, seed=5)
    # items are (index, frames, height, width); the "sample" is its index
    return BucketBatches(DataLoader(IndexOf(), batch_sampler=sampler, collate_fn=list))


def test_extra_state_round_trip():
    state = TrainState(model=None, optimizer=None, lr_scheduler=None, batches=image_stream(), step=7, run_id="r1",
                       flops_per_step=1.5e9)
    for _ in range(7):
        next(state.batches)  # 5 batches an epoch: now batch 2 of epoch 1
    saved = {**state.extra_state(), "step": state.step, "config": {}}
    assert saved == {"epoch": 1, "batch_in_epoch": 2, "run_id": "r1", "flops_per_step": 1.5e9, "step": 7,
                     "config": {}}
    restored = TrainState(model=None, optimizer=None, lr_scheduler=None, batches=image_stream())
    restored.load_extra_state(saved)
    assert (restored.step, restored.run_id, restored.flops_per_step) == (7, "r1", 1.5e9)
    assert [next(restored.batches)[0].tolist() for _ in range(4)] == [next(state.batches)[0].tolist() for _ in range(4)]


def test_a_fresh_run_starts_at_zero_with_a_new_run_id():
    state = TrainState(model=None, optimizer=None, lr_scheduler=None, batches=image_stream())
    state.load_extra_state({})
    assert state.step == 0 and len(state.run_id) == 32 and state.flops_per_step is None
    assert "flops_per_step" not in state.extra_state()  # not counted yet: not saved
    assert next(state.batches)[0].tolist() == next(image_stream())[0].tolist()


def test_bucket_stream_resumes_from_its_cursors():
    full = bucket_stream()
    taken = [next(full) for _ in range(3)]
    position = full.state_dict()
    assert "bucket_cursors" in position
    resumed = bucket_stream()
    resumed.load_state_dict(position)
    assert [next(resumed) for _ in range(3)] == [next(full) for _ in range(3)]
    fresh = bucket_stream()
    fresh.load_state_dict({})  # no position: the start of epoch 0
    assert [next(fresh) for _ in range(3)] == taken
