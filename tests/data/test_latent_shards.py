"""Latents in shards (``data.latent_shards``, mosaicml-streaming's MDS): the parts of several extraction
ranks merged into one dataset that gives back every tensor with its dtype, read from a local folder or
an object store URL (a downloader registered for a test scheme stands in for s3://); a run interrupted
at 2 data-parallel ranks and resumed at 1 or 4 sees exactly the samples it had not seen; a folder of
per-clip .pt files converts to the same samples; a truncated shard is named."""

import os

import pytest
import torch

from opendit_lite.data.latent_shards import LatentShards, LatentShardWriter, check_shards
from opendit_lite.data.resumable_sampler import ResumableBatches, ResumableDistributedSampler
from tests.pipeline_runs import load_script

SIZE = [1, 16, 16]


def _sample(row: int):
    latents = torch.full((4, 1, 2, 2), float(row))
    text = {"encoder_hidden_states": torch.full((3, 8), float(row), dtype=torch.bfloat16),
            "encoder_attention_mask": torch.tensor([True, row % 2 == 0, False])}
    return latents, text, f"caption {row}"


def _write(out: str, rows_per_part):
    """Shards of the rows of each part (one part per extraction rank), merged as rank 0 merges them."""
    parts = []
    for rank, rows in enumerate(rows_per_part):
        writer = LatentShardWriter(out, rank, shard_bytes=400)  # small shards: several files per part
        for row in rows:
            writer.write(row, *_sample(row))
        parts.append(writer.close())
    load_script("scripts/extract_latents.py").write_shard_meta(
        out, parts, {row: SIZE for rows in rows_per_part for row in rows},
        {"encoder_hidden_states": torch.zeros(1, 3, 8)}, {"format": "pipeline"})
    from opendit_lite.data.video_latents import video_latent_meta

    return video_latent_meta(out)


def test_the_ranks_parts_read_back_as_one_dataset_with_their_dtypes(tmp_path):
    meta = _write(str(tmp_path), [[0, 2, 4], [1, 3]])
    assert meta["storage"] == "mds" and meta["rows"] == [0, 2, 4, 1, 3] and meta["pixel_sizes"] == [SIZE]
    dataset = LatentShards(str(tmp_path), meta)
    assert len(dataset) == 5 and dataset.sample_shapes == [tuple(SIZE)] * 5
    assert len([f for f in os.listdir(tmp_path / "part-00000") if f.endswith(".mds")]) > 1
    for i, row in enumerate(meta["rows"]):
        latents, text, caption = dataset[(i, *SIZE)]
        want_latents, want_text, want_caption = _sample(row)
        assert torch.equal(latents, want_latents) and caption == want_caption
        assert text.keys() == want_text.keys()
        for k in want_text:
            assert text[k].dtype == want_text[k].dtype and torch.equal(text[k], want_text[k])
    from opendit_lite.data.video_latents import load_null_text

    assert torch.equal(load_null_text(str(tmp_path))["encoder_hidden_states"], torch.zeros(1, 3, 8))


def test_a_url_streams_through_the_object_store_downloader(tmp_path, monkeypatch):
    from streaming.base.storage import download

    class TestStore(download.LocalDownloader):  # testfs://<path> is the local <path>, as s3://bucket/key is S3's
        def _download_file_impl(self, remote, local, timeout):
            super()._download_file_impl(remote[len("testfs://"):], local, timeout)

        def _validate_remote_path(self, remote):
            pass

    monkeypatch.setitem(download.DOWNLOADER_MAPPINGS, "testfs", TestStore)
    monkeypatch.setenv("OPENDIT_SHARD_CACHE", str(tmp_path / "cache"))
    _write(str(tmp_path / "store"), [[5, 6]])
    url = f"testfs://{tmp_path / 'store'}"
    from opendit_lite.data.video_latents import load_null_text, video_latent_meta

    meta = video_latent_meta(url)
    assert meta["rows"] == [5, 6]
    dataset = LatentShards(url, meta)
    assert dataset[1][2] == "caption 6" and torch.equal(dataset[0][0], _sample(5)[0])
    assert "encoder_hidden_states" in load_null_text(url)


def _rows_seen(dataset, world: int, global_batch: int, epoch_batches: int, start_batch: int = 0, batches=None):
    """The captions each data-parallel rank of ``world`` reads from ``start_batch`` for ``batches`` batches, as
    the trainer's stream reads them (its sampler's permutation, its position in global batches)."""
    seen = []
    micro = global_batch // world
    for rank in range(world):
        sampler = ResumableDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=3,
                                              drop_last=True)
        loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=micro,
                                             collate_fn=lambda items: [item[2] for item in items])
        stream = ResumableBatches(loader, micro, epoch=0, batch_in_epoch=start_batch)
        for _ in range((epoch_batches - start_batch) if batches is None else batches):
            seen += next(stream)
    return seen


def test_a_run_interrupted_at_2_ranks_resumes_at_1_or_4_on_exactly_the_unseen_samples(tmp_path):
    meta = _write(str(tmp_path), [list(range(0, 24, 2)), list(range(1, 24, 2))])
    dataset = LatentShards(str(tmp_path), meta)
    every = {f"caption {row}" for row in range(24)}
    before = _rows_seen(dataset, 2, 4, 6, batches=3)                     # 3 of the epoch's 6 global batches
    assert len(before) == len(set(before)) == 12
    for world in (1, 4):
        after = _rows_seen(dataset, world, 4, 6, start_batch=3)
        assert len(after) == len(set(after)) == 12 and set(after) == every - set(before)


def test_per_clip_files_convert_to_the_same_samples(tmp_path):
    from opendit_lite.data.video_latents import save_null_text, save_pipeline_latents, write_video_latent_meta

    old = tmp_path / "pt"
    for row in (0, 1, 2):
        latents, text, caption = _sample(row)
        save_pipeline_latents(str(old), row, latents, text, caption)
    save_null_text(str(old), {"encoder_hidden_states": torch.ones(1, 3, 8)})
    write_video_latent_meta(str(old), {"format": "pipeline", "fingerprint": "f", "pixel_sizes": [SIZE],
                                       "files": {f"{r:08d}.pt": SIZE for r in range(3)}})
    load_script("scripts/extract_latents.py").main(["--convert", str(old), "--output", str(tmp_path / "shards")])
    from opendit_lite.data.video_latents import video_latent_meta

    meta = video_latent_meta(str(tmp_path / "shards"))
    assert meta["fingerprint"] == "f" and meta["rows"] == [0, 1, 2]
    dataset = LatentShards(str(tmp_path / "shards"), meta)
    for i in range(3):
        assert torch.equal(dataset[i][1]["encoder_attention_mask"], _sample(i)[1]["encoder_attention_mask"])


def test_a_truncated_shard_is_named(tmp_path):
    _write(str(tmp_path), [[0, 1, 2, 3]])
    shard = sorted((tmp_path / "part-00000").glob("*.mds"))[1]
    shard.write_bytes(shard.read_bytes()[:-5])
    with pytest.raises(ValueError, match=rf"{shard.name} .*holds \d+ bytes, its index says \d+"):
        check_shards(str(tmp_path))


def _read_all(rank, world_size, path, meta):
    dataset = LatentShards(path, meta)
    return [dataset[(i, *SIZE)][2] for i in range(len(dataset))]


def test_every_rank_of_a_run_reads_the_whole_dataset(tmp_path):
    """Under torchrun each rank's streaming dataset counts one rank's share of the samples (``len``); the
    trainer's sampler indexes the whole dataset on every rank, so every rank reads every sample."""
    from tests.distributed import run_distributed

    meta = _write(str(tmp_path), [[0, 2, 4], [1, 3]])
    captions = [f"caption {row}" for row in meta["rows"]]
    assert run_distributed(_read_all, world_size=2, args=(str(tmp_path), meta)) == [captions, captions]
