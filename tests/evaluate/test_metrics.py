"""The metric pipeline on CPU with tiny random feature extractors: FID against a scipy reference of
the Frechet distance, the three reference formats, Inception Score and precision/recall in cases
with a known answer, and the error for missing Inception weights."""

import os

import numpy as np
import pytest
import scipy.linalg
import torch
from PIL import Image

from opendit_lite.config import ConfigError
from opendit_lite.evaluate import load_inception, load_reference, score_images


class TinyFeatures(torch.nn.Module):
    """A random conv net standing in for Inception: 16-d pool features and 10 logits."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 16, 3, stride=2)
        self.head = torch.nn.Linear(16, 10)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    @torch.no_grad()
    def forward(self, images: torch.Tensor):
        x = images.float() / 127.5 - 1                                # uint8 [N, 3, H, W] -> [-1, 1]
        pool = torch.tanh(self.conv(x)).mean(dim=(2, 3))              # [N, 16]
        return pool, self.head(pool)                                  # [N, 16], [N, 10]


def random_images(n: int, seed: int, size: int = 12, shift: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.integers(0, 256, (n, size, size, 3)) + shift, 0, 255).astype(np.uint8)


def reference_fid(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance of Gaussians fitted to feature sets a [N, D] and b [M, D], with scipy's sqrtm."""
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def features_of(fn, images: np.ndarray) -> np.ndarray:
    return fn(torch.from_numpy(images).permute(0, 3, 1, 2))[0].double().numpy()


def write_references(tmp, images: np.ndarray, fn):
    """The same reference set as an .npz of images, a PNG folder and an .npz of mu/sigma."""
    arr = os.path.join(tmp, "ref_images.npz")
    np.savez(arr, arr_0=images)
    folder = os.path.join(tmp, "ref_folder", "class0")
    os.makedirs(folder)
    for i, img in enumerate(images):
        Image.fromarray(img).save(os.path.join(folder, f"{i:04d}.png"))
    feats = features_of(fn, images)
    stats = os.path.join(tmp, "ref_stats.npz")
    np.savez(stats, mu=feats.mean(0), sigma=np.cov(feats, rowvar=False))
    return arr, os.path.dirname(folder), stats


def test_fid_matches_scipy_for_every_reference_format(tmp_path):
    fn = TinyFeatures()
    samples, ref_images = random_images(96, 1), random_images(80, 2, shift=40)
    want = reference_fid(features_of(fn, samples), features_of(fn, ref_images))
    assert want > 1e-3  # the two sets differ
    for ref in write_references(str(tmp_path), ref_images, fn):
        got = score_images(samples, load_reference(ref, fn, batch_size=32), fn, batch_size=7)["fid"]
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9), ref


def test_fid_of_a_set_with_itself_is_zero(tmp_path):
    fn = TinyFeatures()
    images = random_images(64, 3)
    arr, _, _ = write_references(str(tmp_path), images, fn)
    assert score_images(images, load_reference(arr, fn, 16), fn, 16)["fid"] == pytest.approx(0.0, abs=1e-6)


def test_reference_statistics_of_another_feature_network_exit_2(tmp_path):
    """mu/sigma computed with another network (e.g. Inception's 2048 for eval.features=shapes) are refused
    with what to pass instead."""
    fn = TinyFeatures()
    stats = os.path.join(str(tmp_path), "other.npz")
    np.savez(stats, mu=np.zeros(32), sigma=np.eye(32))
    with pytest.raises(ConfigError, match="another feature network"):
        score_images(random_images(8, 4), load_reference(stats, fn, 8), fn, 8)


def test_inception_score_in_two_closed_form_cases():
    """IS = exp(E_x KL(p(y|x) || p(y))): 1 when every prediction is the same (uniform) distribution;
    K when each image is confidently one of K classes and the classes are equally frequent (up to the
    sampling noise of the class counts in each of the 10 shuffled splits)."""
    k, n = 5, 5000
    images = np.zeros((n, 4, 4, 3), np.uint8)
    images[:, 0, 0, 0] = np.arange(n) % k

    def one_hot_logits(batch):
        cls = batch[:, 0, 0, 0].long()
        return torch.zeros(len(batch), 4), torch.nn.functional.one_hot(cls, k).double() * 50.0

    def flat_logits(batch):
        return torch.zeros(len(batch), 4), torch.zeros(len(batch), k)

    assert score_images(images, None, flat_logits, batch_size=999)["inception_score"] == pytest.approx(1.0, abs=1e-9)
    metrics = score_images(images, None, one_hot_logits, batch_size=999)
    assert metrics["inception_score"] == pytest.approx(k, rel=1e-2)
    assert "fid" not in metrics


def test_precision_recall_of_identical_and_disjoint_sets(tmp_path):
    fn = TinyFeatures()
    images = random_images(40, 4)
    arr, _, stats = write_references(str(tmp_path), images, fn)
    same = score_images(images, load_reference(arr, fn, 16, need_features=True), fn, 16, precision_recall=True)
    assert same["precision"] == 1.0 and same["recall"] == 1.0
    far = np.full_like(images, 255)                        # one far-away point, repeated
    other = score_images(far, load_reference(arr, fn, 16, need_features=True), fn, 16, precision_recall=True)
    assert other["precision"] == 0.0
    with pytest.raises(ConfigError, match="holds only mu/sigma"):
        load_reference(stats, fn, 16, need_features=True)


def test_missing_inception_weights_say_where_to_put_them(tmp_path):
    with pytest.raises(ConfigError, match="eval.inception_path.*weights-inception-2015-12-05-6726825d.pth"):
        load_inception(None, "cpu")
    with pytest.raises(ConfigError, match="is not a file"):
        load_inception(str(tmp_path / "missing.pth"), "cpu")
