"""Datasets by name: the embedded ``shapes`` default, an ``image_folder`` and precomputed ``latents``."""

from .image_folder import build_image_folder, center_crop_arr
from .latents import LatentDataset
from .shapes import ShapesDataset


def build_dataset(kind: str, path=None, image_size: int = 32, num_samples: int = 4096,
                  random_flip: bool = True, seed: int = 0):
    """Returns a Dataset of (tensor, label); ``dataset.classes`` lists the class names."""
    if kind == "shapes":
        return ShapesDataset(num_samples=num_samples, image_size=image_size, seed=seed)
    if kind == "image_folder":
        return build_image_folder(path, image_size, random_flip)
    if kind == "latents":
        return LatentDataset(path, random_flip=random_flip)
    raise ValueError(f"unknown dataset kind {kind!r}; choose shapes, image_folder or latents")


__all__ = ["build_dataset", "build_image_folder", "center_crop_arr", "LatentDataset", "ShapesDataset"]
