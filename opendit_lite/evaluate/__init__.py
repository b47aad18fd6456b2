"""Sample-quality evaluation: ``python -m opendit_lite.evaluate --config CFG`` generates
``eval.samples_per_class`` images per class over all ranks into ``samples.npz`` (DiT's sample_ddp
convention: ``arr_0``, uint8 [N, H, W, 3]) and scores them against a reference: FID, Inception
Score and optionally precision/recall, computed by torch-fidelity from InceptionV3 weights at a
local path (``eval.inception_path``; nothing is downloaded).

The pieces are usable on their own: ``load_inception`` (the feature extractor), ``load_reference``
(statistics from an .npz or an image folder), ``score_images`` (any feature extractor, e.g. a tiny
random one in tests) and ``generate_samples``.
"""

from .features import FeatureFn, extract_features, load_inception
from .images import load_images
from .metrics import score_images
from .reference import Reference, load_reference

__all__ = ["FeatureFn", "Reference", "extract_features", "load_images", "load_inception", "load_reference",
           "score_images"]
