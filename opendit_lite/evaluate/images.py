"""Image sets on disk: DiT's sample .npz (``arr_0``, uint8 [N, H, W, 3]) and image folders."""

import os
import zipfile
from typing import Dict, List, Tuple

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
    check_images_file(path)
    with np.load(path) as data:
        return data["arr_0"]


def npz_arrays(path: str) -> Dict[str, Tuple[Tuple[int, ...], np.dtype]]:
    """{name: (shape, dtype)} of the arrays of the .npz at ``path``, from their headers only (cheap
    for a file of 50,000 images); a file that is not an .npz is a ConfigError naming it."""
    try:
        with zipfile.ZipFile(path) as archive:
            found = {}
            for member in archive.namelist():
                if member.endswith(".npy"):
                    with archive.open(member) as f:
                        version = np.lib.format.read_magic(f)
                        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                else np.lib.format.read_array_header_2_0)
                        shape, _, dtype = read(f)
                    found[member[:-4]] = (shape, dtype)
            return found
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ConfigError(f"{path!r} is not a readable .npz file ({type(e).__name__}: {e}): pass a file written by "
                          f"numpy.savez (e.g. DiT's sample .npz with arr_0) or a folder of images.") from None


def check_images_file(path: str) -> Tuple[int, ...]:
    """The shape of the uint8 [N, H, W, 3] images ``arr_0`` of the .npz at ``path``, checked from its
    header (a missing, wrongly shaped or unreadable file is a ConfigError)."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path!r} is not a file: pass an .npz holding arr_0 (uint8 [N, H, W, 3] images).")
    arrays = npz_arrays(path)
    if "arr_0" not in arrays:
        raise ConfigError(f"{path!r} holds no 'arr_0' images (found: {', '.join(arrays) or 'no arrays'}).")
    shape, dtype = arrays["arr_0"]
    if dtype != np.uint8 or len(shape) != 4 or shape[-1] != 3 or shape[0] == 0:
        raise ConfigError(f"'arr_0' in {path!r} must be uint8 [N, H, W, 3] images with N >= 1; got {dtype} "
                          f"{list(shape)}.")
    return shape


def save_npz(path: str, images: np.ndarray, **extra: np.ndarray) -> str:
    """Write ``arr_0`` (and extra arrays) atomically: a temporary file renamed when complete."""
    tmp = path + ".tmp.npz"
    np.savez(tmp, arr_0=images, **extra)
    os.replace(tmp, path)
    return path
