import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from opendit_lite.data import LatentDataset, ShapesDataset, build_dataset, center_crop_arr
from opendit_lite.data.latents import write_latent_meta, write_latent_shard
from opendit_lite.data.resumable_sampler import ResumableDistributedSampler
from tests.tiny_assets import save_tiny_vae, write_image_folder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_shapes_are_deterministic_labelled_and_in_range():
    ds = ShapesDataset(num_samples=24, image_size=16, num_classes=8, seed=3)
    x, y = ds[5]
    assert x.shape == (3, 16, 16) and y == 5
    assert x.min() >= -1 and x.max() <= 1
    torch.testing.assert_close(ShapesDataset(24, 16, 8, seed=3)[5][0], x)
    assert not torch.equal(ShapesDataset(24, 16, 8, seed=4)[5][0], x)
    assert len(ds.classes) == 8 and ds.classes[0] == "red circle"


def test_shapes_classes_differ_in_colour():
    """Each class is drawn in its own colour: the mean colour of the shape pixels tells classes apart."""
    ds = ShapesDataset(num_samples=16, image_size=32, num_classes=8)
    means = []
    for i in range(8):
        x, _ = ds[i]
        fg = x.mean(0) > x.mean(0).median()  # the brighter pixels: the shape
        means.append(x[:, fg].mean(1))
    dists = torch.cdist(torch.stack(means), torch.stack(means))
    assert (dists + torch.eye(8) * 10).min() > 0.1


def test_center_crop_matches_definition():
    img = Image.fromarray(np.random.RandomState(0).randint(0, 255, (300, 500, 3), dtype=np.uint8))
    out = center_crop_arr(img, 64)
    assert out.size == (64, 64)
    # wide image: the crop is centred horizontally
    big = Image.fromarray(np.tile(np.arange(500, dtype=np.uint8)[None, :, None], (100, 1, 3)))
    crop = np.array(center_crop_arr(big, 100))
    assert abs(int(crop[0, 50, 0]) - 250) <= 2


def test_image_folder(tmp_path):
    for cls in ("cats", "dogs"):
        os.makedirs(tmp_path / cls)
        for i in range(2):
            Image.new("RGB", (40, 30), (i * 100, 50, 200)).save(tmp_path / cls / f"{i}.png")
    ds = build_dataset("image_folder", path=str(tmp_path), image_size=16)
    x, y = ds[3]
    assert x.shape == (3, 16, 16) and y == 1 and ds.classes == ["cats", "dogs"]
    assert -1 <= x.min() and x.max() <= 1


def test_latent_shards_round_trip(tmp_path):
    lat = torch.randn(5, 4, 2, 3)
    write_latent_shard(str(tmp_path), 0, lat[:3], torch.tensor([0, 1, 2]))
    write_latent_shard(str(tmp_path), 1, lat[3:], torch.tensor([3, 4]))
    write_latent_meta(str(tmp_path), {"channels": 4, "height": 2, "width": 3, "classes": list("abcde")})
    ds = LatentDataset(str(tmp_path))
    assert len(ds) == 5 and ds.classes == list("abcde")
    for i in range(5):
        x, y = ds[i]
        torch.testing.assert_close(x, lat[i])
        assert y == i
    (tmp_path / "shard_00002.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="shard_00002.safetensors"):
        LatentDataset(str(tmp_path))


def test_resumable_sampler_continues_mid_epoch():
    data = list(range(20))
    full = ResumableDistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=5)
    full.set_epoch(3)
    order = list(full)
    part = ResumableDistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=5)
    part.set_epoch(3)
    part.set_start_index(4)
    assert list(part) == order[4:] and len(part) == len(order) - 4


def test_extract_latents_script(tmp_path):
    """scripts/extract_latents.py with a tiny randomly initialised AutoencoderKL saved locally."""
    save_tiny_vae(tmp_path / "vae")
    write_image_folder(tmp_path / "img", per_class=3)
    proc = subprocess.run([sys.executable, "scripts/extract_latents.py", "--data-path", str(tmp_path / "img"),
                           "--vae-path", str(tmp_path / "vae"), "--output", str(tmp_path / "lat"),
                           "--image-size", "16", "--batch-size", "4", "--shard-size", "4", "--num-workers", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ds = LatentDataset(str(tmp_path / "lat"))
    assert len(ds) == 6 and ds.classes == ["a", "b"]
    x, y = ds[4]
    assert x.shape == (4, 8, 8) and y == 1  # this tiny VAE downsamples by 2
