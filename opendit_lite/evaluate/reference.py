"""The reference side of FID: mean and covariance of reference features, read from an .npz
(``mu``/``sigma``, as ADM's reference batches and torch-fidelity's caches store them) or computed from
reference images (an .npz with ``arr_0`` or a folder), whose features also serve precision/recall."""

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..config import ConfigError
from .features import FeatureFn, extract_features
from .images import IMAGE_EXTENSIONS, check_images_file, image_files, load_images, npz_arrays


@dataclass
class Reference:
    mu: np.ndarray                       # [D] float64
    sigma: np.ndarray                    # [D, D] float64
    features: Optional[torch.Tensor]     # [N, D] when computed from images (precision/recall), else None


def statistics(features: torch.Tensor):
    """(mu [D], sigma [D, D]) of features [N, D], by torch-fidelity (unbiased covariance), in float64."""
    from torch_fidelity.metric_fid import fid_features_to_statistics

    stats = fid_features_to_statistics(features.double())
    return stats["mu"], stats["sigma"]


def check_reference_file(path: str) -> None:
    """``eval.reference`` is a folder of images, or an .npz holding mu/sigma or arr_0 images (read
    from the headers only), before anything is sampled."""
    if not os.path.exists(path):
        raise ConfigError(f"'eval.reference' {path!r} does not exist: point it at an .npz with mu/sigma, an .npz "
                          f"with arr_0 images, or a folder of reference images.")
    if os.path.isdir(path):
        if not image_files(path):
            raise ConfigError(f"'eval.reference' {path!r} is a folder without images ({', '.join(IMAGE_EXTENSIONS)}).")
        return
    arrays = npz_arrays(path)
    if "arr_0" in arrays:
        check_images_file(path)
    elif not {"mu", "sigma"} <= set(arrays):
        raise ConfigError(f"'eval.reference' {path!r} holds neither mu/sigma nor arr_0 images (found: "
                          f"{', '.join(arrays) or 'no arrays'}).")


def load_reference(path: str, feature_fn: FeatureFn, batch_size: int, need_features: bool = False,
                   progress: bool = False) -> Reference:
    """Reference statistics from ``path``. An .npz with ``mu``/``sigma`` is used as it is unless
    ``need_features`` (precision/recall) asks for the images' features, which then need ``arr_0``."""
    check_reference_file(path)
    if not os.path.isdir(path):
        with np.load(path) as data:
            has_stats, has_images = {"mu", "sigma"} <= set(data.files), "arr_0" in data.files
            if has_stats and not (need_features and has_images):
                if need_features:
                    raise ConfigError(f"'eval.precision_recall' needs reference images, and {path!r} holds only "
                                      f"mu/sigma: pass reference images (an .npz with arr_0 or a folder).")
                return Reference(data["mu"].astype(np.float64), data["sigma"].astype(np.float64), None)
    features, _ = extract_features(feature_fn, load_images(path), batch_size, progress, desc="reference features")
    mu, sigma = statistics(features)
    return Reference(mu, sigma, features)
