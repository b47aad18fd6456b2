"""The bucket sampler: shapes from config entries, assignment, determinism, bucket probabilities,
resumption at another world size without repeating or skipping samples, one batch per SP group."""

import collections
import itertools

import pytest
import torch

from opendit_lite.data.buckets import (
    BucketBatches,
    BucketBatchSampler,
    assign_bucket,
    parse_buckets,
    resolution_shape,
)

ENTRIES = [
    {"frames": 8, "height": 32, "width": 48, "batch_size": 2},
    {"frames": 4, "height": 32, "width": 32, "batch_size": 3, "probability": 2.0},
    {"frames": 1, "height": 64, "width": 64, "batch_size": 4, "loss_weight": 0.5, "name": "images"},
]


def _shapes(n=300):
    own = [(8, 32, 48), (4, 32, 32), (1, 64, 64)]
    return [own[i % 3] for i in range(n)]


def _epoch(buckets, shapes, dp_size, seed=0, state=None, stop_after=None):
    """{dp_rank: list of batches} for the rest of one epoch (or ``stop_after`` steps)."""
    out = {}
    for rank in range(dp_size):
        s = BucketBatchSampler(buckets, shapes, dp_rank=rank, dp_size=dp_size, seed=seed)
        if state:
            s.load_state_dict(state)
        batches = list(s)
        out[rank] = batches[:stop_after] if stop_after is not None else batches
    return out


def test_parse_names_resolutions_and_checks():
    assert resolution_shape("240p", "16:9", 16) == (240, 432)
    assert resolution_shape("240p", "9:16", 16) == (432, 240)
    b = parse_buckets([{"frames": 16, "resolution": "144p", "aspect_ratio": "16:9", "batch_size": 2}], 16)[0]
    assert (b.frames, b.height % 16, b.width % 16) == (16, 0, 0) and b.width > b.height
    assert parse_buckets([{"frames": 1, "height": 8, "width": 8}])[0].batch_size is None  # auto
    for bad, match in [({"frames": 1}, "resolution"), ({"height": 8, "width": 8, "colour": 1}, "unknown keys"),
                       ({"height": 10, "width": 8, "batch_size": 1}, "multiple")]:
        with pytest.raises(ValueError, match=match):
            parse_buckets([bad], 4 if match == "multiple" else 1)


def test_assignment_prefers_aspect_then_frames_then_pixels():
    buckets = parse_buckets(ENTRIES)
    assert assign_bucket(buckets, (10, 40, 60)) == 0          # 3:2 video -> the 3:2 bucket
    assert assign_bucket(buckets, (5, 40, 40)) == 1           # square video, too short for 8 frames
    assert assign_bucket(buckets, (1, 80, 80)) == 2           # an image -> the image bucket
    assert assign_bucket(buckets, (1, 16, 16)) is None        # smaller than every bucket: left out


def test_deterministic_and_one_bucket_per_step_across_ranks():
    buckets = parse_buckets(ENTRIES)
    a, b = _epoch(buckets, _shapes(), 2), _epoch(buckets, _shapes(), 2)
    assert a == b
    assert _epoch(buckets, _shapes(), 2, seed=1) != a
    for r0, r1 in zip(a[0], a[1]):  # every step: the same bucket on both ranks, different samples
        assert r0[0][1:] == r1[0][1:] and not {i for i, *_ in r0} & {i for i, *_ in r1}
        assert len({s[1:] for s in r0}) == 1


def test_epoch_covers_every_sample_once_up_to_a_partial_batch():
    buckets = parse_buckets(ENTRIES)
    shapes = _shapes()
    batches = _epoch(buckets, shapes, 2)
    seen = [i for rank in batches.values() for batch in rank for i, *_ in batch]
    assert len(seen) == len(set(seen))
    per_bucket = collections.Counter(shapes[i] for i in seen)
    for b in buckets:  # what is left of a bucket is less than one global batch (batch_size x 2 ranks)
        assert 0 <= 100 - per_bucket[b.shape] < 2 * b.batch_size


def test_resume_at_another_world_size_repeats_and_skips_nothing():
    buckets = parse_buckets(ENTRIES)
    shapes = _shapes()
    # 4 data-parallel ranks for 5 steps, then the checkpointed position continues on 2 ranks.
    first = _epoch(buckets, shapes, 4, stop_after=5)
    position = BucketBatchSampler(buckets, shapes, dp_rank=0, dp_size=4).position_after(5)
    rest = _epoch(buckets, shapes, 2, state=position)
    seen = [i for run in (first, rest) for rank in run.values() for batch in rank for i, *_ in batch]
    assert len(seen) == len(set(seen)), "a sample was repeated"
    per_bucket = collections.Counter(shapes[i] for i in seen)
    for b in buckets:  # nothing skipped: only less than one global batch of the new size remains
        assert 0 <= 100 - per_bucket[b.shape] < 2 * b.batch_size


def test_bucket_probabilities_are_honoured():
    buckets = parse_buckets([{"frames": 1, "height": 8, "width": 8, "batch_size": 1, "probability": 1.0},
                             {"frames": 2, "height": 8, "width": 8, "batch_size": 1, "probability": 3.0}])
    shapes = [(1, 8, 8), (2, 8, 8)] * 5000
    first = list(itertools.islice(BucketBatchSampler(buckets, shapes, seed=3), 2000))  # both buckets still full here
    share = sum(batch[0][1] == 2 for batch in first) / len(first)
    assert share == pytest.approx(0.75, abs=0.03)


def test_bucket_batches_stream_saves_the_handed_out_position():
    from opendit_lite.data.video_shapes import MovingShapesDataset

    buckets = parse_buckets([{"frames": 2, "height": 8, "width": 16, "batch_size": 2},
                             {"frames": 1, "height": 16, "width": 16, "batch_size": 3}])
    data = MovingShapesDataset(num_samples=12, shapes=[b.shape for b in buckets], caption_channels=4)

    def loader():
        return torch.utils.data.DataLoader(data, batch_sampler=BucketBatchSampler(buckets, data.sample_shapes))

    stream = BucketBatches(loader())
    shapes = [tuple(next(stream)[0].shape) for _ in range(7)]       # crosses into the second epoch
    assert {s[2:] for s in shapes} == {(2, 8, 16), (1, 16, 16)} and shapes[0][1] == 3
    resumed = BucketBatches(loader(), stream.state_dict())
    nxt = next(stream)
    again = next(resumed)
    assert torch.equal(nxt[0], again[0]) and nxt[3] == again[3]
