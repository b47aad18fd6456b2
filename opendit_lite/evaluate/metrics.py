"""FID, Inception Score and precision/recall of a set of images, by torch-fidelity's functions on
features from any ``FeatureFn``."""

from typing import Dict, Optional

import numpy as np

from ..errors import ConfigError
from .features import FeatureFn, extract_features
from .reference import Reference, statistics


def score_images(images: np.ndarray, reference: Optional[Reference], feature_fn: FeatureFn, batch_size: int,
                 precision_recall: bool = False, progress: bool = False) -> Dict[str, float]:
    """Metrics of uint8 images [N, H, W, 3]: ``fid`` (against ``reference``), ``inception_score``
    (mean and std over 10 splits, when the extractor gives logits), ``precision``/``recall`` (when
    asked, against the reference's features; k = 3 nearest neighbours)."""
    from torch_fidelity.metric_fid import fid_statistics_to_metric
    from torch_fidelity.metric_isc import isc_features_to_metric
    from torch_fidelity.metric_prc import prc_features_to_metric

    features, logits = extract_features(feature_fn, images, batch_size, progress, desc="sample features")
    out: Dict[str, float] = {"num_samples": float(len(images))}
    if reference is not None:
        mu, sigma = statistics(features)
        ref = {"mu": np.asarray(reference.mu, np.float64), "sigma": np.asarray(reference.sigma, np.float64)}
        if ref["mu"].shape != mu.shape:
            raise ConfigError(f"the reference statistics (eval.reference) have {ref['mu'].shape[0]} features, the "
                              f"samples {mu.shape[0]}: they were computed with another feature network than "
                              f"eval.features names (InceptionV3: 2048, the shapes network: 64). Pass reference "
                              f"images (an .npz with arr_0, or a folder) so they are scored with the same network, or "
                              f"set eval.features to the network the statistics were computed with.")
        fid = fid_statistics_to_metric({"mu": mu, "sigma": sigma}, ref, verbose=False)
        out["fid"] = fid["frechet_inception_distance"]
    if logits is not None:
        isc = isc_features_to_metric(logits, splits=min(10, len(images)))
        out["inception_score"], out["inception_score_std"] = isc["inception_score_mean"], isc["inception_score_std"]
    if precision_recall:
        if reference is None or reference.features is None:
            raise ValueError("precision/recall need the reference images' features")
        prc = prc_features_to_metric(features, reference.features, prc_neighborhood=3, prc_batch_size=10000,
                                     save_cpu_ram=False, verbose=False)
        out["precision"], out["recall"] = prc["precision"], prc["recall"]
    return out
