"""The shapes features shipped with the package (``eval.features=shapes``): the weights file loads, its
classifier names the class of fresh shapes images, FID on its features is small between two draws of
the data and large against noise, and images of another size are refused with exit code 2."""

import os

import numpy as np
import pytest
import torch

from opendit_lite.data.shapes import ShapesDataset
from opendit_lite.errors import ConfigError
from opendit_lite.evaluate.features import extract_features
from opendit_lite.evaluate.generate import to_uint8
from opendit_lite.evaluate.metrics import score_images
from opendit_lite.evaluate.reference import Reference, statistics
from opendit_lite.evaluate.shapes_features import WEIGHTS_FILE, load_shapes_features, load_shapes_net
from tests.evaluate.test_evaluate_command import evaluate_main


def shapes_images(n: int, seed: int):
    """uint8 [n, 16, 16, 3] shapes images as the evaluation sees samples, and their labels [n]."""
    data = ShapesDataset(num_samples=n, image_size=16, seed=seed)
    images, labels = zip(*(data[i] for i in range(n)))
    return to_uint8(torch.stack(images)), np.asarray(labels)


def test_shipped_features_classify_fresh_shapes_and_separate_data_from_noise():
    assert os.path.getsize(WEIGHTS_FILE) < 300_000
    reference, _ = shapes_images(512, seed=0)          # the demo's training images (its seed)
    fresh, labels = shapes_images(512, seed=4242)      # neither the demo's nor the features' training seed
    with torch.no_grad():
        _, logits, _ = load_shapes_net()(torch.from_numpy(fresh).permute(0, 3, 1, 2))
    accuracy = (logits.argmax(1).numpy() == labels).mean()
    assert accuracy >= 0.99, accuracy

    fn = load_shapes_features("cpu")
    mu, sigma = statistics(extract_features(fn, reference, 256)[0])
    ref = Reference(mu, sigma, None)
    same = score_images(fresh, ref, fn, 256)["fid"]    # measured 0.7
    noise = np.random.default_rng(0).integers(0, 256, fresh.shape, dtype=np.uint8)
    far = score_images(noise, ref, fn, 256)["fid"]     # measured ~900
    blurred = ((fresh.astype(np.float32) + np.roll(fresh, 1, 1) + np.roll(fresh, 1, 2)
                + np.roll(fresh, -1, 1)) / 4).round().astype(np.uint8)
    soft = score_images(blurred, ref, fn, 256)["fid"]  # measured ~14: a mild defect counts
    assert same < 3 and soft > 4 * same and far > 100 * same, (same, soft, far)

    with pytest.raises(ConfigError, match="eval.features=shapes scores 16x16 images"):
        fn(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


@pytest.mark.parametrize("override, expected", [
    (["data.image_size=32"], "this config's images (data.image_size) are 32x32"),
    (["eval.inception_path=/models/inception.pth"], "would not be used"),
])
def test_shapes_features_refuse_other_inputs_with_exit_2(override, expected, capsys):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main(["--config", os.path.join(root, "configs/demo.yaml"), "eval.features=shapes", *override])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
