"""The shapes features: a small CNN trained on the embedded shapes data (``data/shapes.py``), shipped
with the package, as the feature network of FID on that data (``eval.features=shapes``).

InceptionV3 cannot be downloaded here and means little on 16 x 16 pictures of coloured shapes. This
network was trained by ``scripts/train_shapes_features.py`` (deterministic, on the CPU, about a minute)
to tell the 8 classes apart and to regress each image's drawing parameters (centre, size, colour
brightness, background), so that its ``FEATURE_DIM``-d features move with everything the data varies
in. Its weights are ``shapes_features.safetensors`` beside this file (about 190 KB). FIDs computed
with it are on another scale than Inception FIDs: compare them only with each other.
"""

import os
from typing import Dict, Tuple

import torch
from torch import nn

from ..config import ConfigError
from .features import FeatureFn

WEIGHTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes_features.safetensors")
IMAGE_SIZE = 16          # the shapes data's side in the demo configs; the network takes no other
NUM_CLASSES = 8          # data/shapes.py's classes
FEATURE_DIM = 64         # FID's feature size: small enough for a covariance from ~1000 samples
NUM_PARAMS = 5           # regressed per image: centre y, centre x, half-extent, colour scale, background


class ShapesFeatureNet(nn.Module):
    """uint8-range images [N, 3, 16, 16] -> (features [N, 64], class logits [N, 8], parameters [N, 5]).

    Three 3x3 convolutions (16 -> 8 -> 4 pixels) keep where things are; a linear layer on the flattened
    map gives the features, and the heads are linear in them, so classes and drawing parameters are
    linear directions of the feature space (what FID's Gaussian statistics see)."""

    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),               # [N, 16, 16, 16]
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),    # [N, 32, 8, 8]
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(),    # [N, 32, 4, 4]
        )
        self.features = nn.Linear(32 * 4 * 4, FEATURE_DIM)
        self.classify = nn.Linear(FEATURE_DIM, NUM_CLASSES)
        self.regress = nn.Linear(FEATURE_DIM, NUM_PARAMS)

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = images.float() / 127.5 - 1                                # [N, 3, 16, 16] in [-1, 1], as the data
        f = self.features(self.convs(x).flatten(1))                   # [N, 64]
        return f, self.classify(f), self.regress(f)                   # [N, 64], [N, 8], [N, 5]


def load_shapes_net(path: str = WEIGHTS_FILE) -> ShapesFeatureNet:
    """The shipped network (or one at ``path``), in eval mode on the CPU."""
    from safetensors.torch import load_file

    if not os.path.isfile(path):
        raise ConfigError(f"the shapes features' weights {path!r} are missing: they ship with the package; "
                          f"reinstall it, or rebuild them with `python scripts/train_shapes_features.py`.")
    net = ShapesFeatureNet()
    net.load_state_dict(load_file(path))
    return net.eval()


def check_shapes_size(height: int, width: int, what: str) -> None:
    """A ConfigError unless ``what`` is ``IMAGE_SIZE`` x ``IMAGE_SIZE`` pixels."""
    if (height, width) != (IMAGE_SIZE, IMAGE_SIZE):
        raise ConfigError(f"eval.features=shapes scores {IMAGE_SIZE}x{IMAGE_SIZE} images of the embedded shapes data "
                          f"(the network was trained on them only), but {what} are {height}x{width}: use "
                          f"eval.features=inception with eval.inception_path for other images, or sample the "
                          f"shapes model at data.image_size={IMAGE_SIZE}.")


def load_shapes_features(device, path: str = WEIGHTS_FILE) -> FeatureFn:
    """The ``FeatureFn`` of the shipped network: 64-d features (FID) and its 8 class logits (the
    classifier's score in place of the Inception Score). Images of another size are a ConfigError."""
    net = load_shapes_net(path).to(device)

    @torch.no_grad()
    def extract(images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        check_shapes_size(images.shape[-2], images.shape[-1], "the images scored")
        features, logits, _ = net(images.to(device))                  # [N, 64], [N, 8]
        return features, logits

    return extract


def metadata() -> Dict[str, str]:
    """What the weights file records about its network (safetensors metadata)."""
    return {"image_size": str(IMAGE_SIZE), "num_classes": str(NUM_CLASSES), "feature_dim": str(FEATURE_DIM)}
