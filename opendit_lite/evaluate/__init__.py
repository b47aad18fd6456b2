"""Sample-quality evaluation: ``python -m opendit_lite.evaluate --config CFG`` generates
``eval.samples_per_class`` images per class over all ranks into ``samples.npz`` (DiT's sample_ddp
convention: ``arr_0``, uint8 [N, H, W, 3]) and scores them against a reference: FID, Inception
Score and optionally precision/recall, computed by torch-fidelity from InceptionV3 weights at a
local path (``eval.inception_path``; nothing is downloaded).

The pieces are usable on their own: ``load_inception`` (the feature extractor), ``load_reference``
(statistics from an .npz or an image folder), ``score_images`` (any feature extractor, e.g. a tiny
random one in tests) and ``generate_samples``. They are imported on first use, so that the command
checks its settings before torch is imported.
"""

import importlib

_LAZY = {
    "FeatureFn": "features", "extract_features": "features", "load_inception": "features",
    "load_images": "images", "score_images": "metrics", "Reference": "reference", "load_reference": "reference",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
