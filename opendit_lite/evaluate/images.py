"""Image sets on disk: DiT's sample .npz (``arr_0``, uint8 [N, H, W, 3]) and image folders."""

import os
from typing import List

import numpy as np
from PIL import Image

from ..config import ConfigError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def image_files(folder: str) -> List[str]:
    """Every image under ``folder`` (sub-folders included), in sorted order."""
    found = [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names
             if name.lower().endswith(IMAGE_EXTENSIONS)]
    return sorted(found)


def load_images(path: str) -> np.ndarray:
    """uint8 [N, H, W, 3] from an .npz holding ``arr_0`` or from a folder of same-sized images."""
    if os.path.isdir(path):
        files = image_files(path)
        if not files:
            raise ConfigError(f"The folder {path!r} holds no images ({', '.join(IMAGE_EXTENSIONS)}).")
        images = [np.asarray(Image.open(f).convert("RGB")) for f in files]
        sizes = sorted({im.shape for im in images})
        if len(sizes) > 1:
            raise ConfigError(f"The images in {path!r} have different sizes ({sizes[0][:2]}, {sizes[-1][:2]}, ...): "
                              f"resize them to one size first (DiT's centre crop for references).")
        return np.stack(images)
    with np.load(path) as data:
        if "arr_0" not in data:
            raise ConfigError(f"{path!r} holds no 'arr_0' images (found: {', '.join(data.files)}).")
        images = data["arr_0"]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ConfigError(f"'arr_0' in {path!r} must be uint8 [N, H, W, 3] images; got {images.dtype} "
                          f"{list(images.shape)}.")
    return images


def save_npz(path: str, images: np.ndarray, **extra: np.ndarray) -> str:
    """Write ``arr_0`` (and extra arrays) atomically: a temporary file renamed when complete."""
    tmp = path + ".tmp.npz"
    np.savez(tmp, arr_0=images, **extra)
    os.replace(tmp, path)
    return path
