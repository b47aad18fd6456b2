"""Image features for the metrics: torch-fidelity's InceptionV3 (the TensorFlow FID network ported to
PyTorch) from a local weights file, or any callable with the same contract (``FeatureFn``)."""

import hashlib
import os
import sys
from typing import Callable, Optional, Tuple

import numpy as np
import torch

from ..config import ConfigError

# uint8 images [N, 3, H, W] -> (pool features [N, D], class logits [N, K] or None)
FeatureFn = Callable[[torch.Tensor], Tuple[torch.Tensor, Optional[torch.Tensor]]]

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
# torch hub's naming convention: the hex digits at the end of the file name begin the file's sha256.
INCEPTION_SHA256_PREFIX = "6726825d"
INCEPTION_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_FILE}"


def load_inception(path: Optional[str], device) -> FeatureFn:
    """torch-fidelity's ``inception-v3-compat`` extractor with weights read from ``path``: 2048-d
    pool features (FID, precision/recall) and the 1008-way logits (Inception Score)."""
    if not path or not os.path.isfile(path):
        where = f"'eval.inception_path' {path!r} is not a file" if path else "'eval.inception_path' is not set"
        raise ConfigError(
            f"{where}: the metrics need torch-fidelity's InceptionV3 weights ({INCEPTION_FILE}, the TensorFlow FID "
            f"network converted to PyTorch) at a local path, and nothing is downloaded at run time. On a machine "
            f"with internet access fetch {INCEPTION_URL} (e.g. with wget or curl), copy the file here and pass "
            f"eval.inception_path=/path/to/{INCEPTION_FILE}.")
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    try:
        torch.load(path, map_location="cpu", weights_only=True)  # tensors only, before torch-fidelity unpickles it
        net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048", "logits_unbiased"],
                                          feature_extractor_weights_path=path).to(device)
    except Exception as e:  # pickled objects, not tensors, or not this network's
        raise ConfigError(f"'eval.inception_path' {path!r} does not hold InceptionV3 weights for torch-fidelity "
                          f"({INCEPTION_FILE}): {type(e).__name__}: {str(e).splitlines()[0][:200]}. Fetch "
                          f"{INCEPTION_URL} again.") from None

    @torch.no_grad()
    def extract(images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        pool, logits = net(images.to(device))  # the net resizes to 299 x 299 itself
        return pool, logits

    digest = file_sha256(path)
    if not digest.startswith(INCEPTION_SHA256_PREFIX):
        check_features_informative(extract, path, digest)
        print(f"warning: 'eval.inception_path' {path!r} is not torch-fidelity's {INCEPTION_FILE} (sha256 "
              f"{digest[:16]}..., expected {INCEPTION_SHA256_PREFIX}...): its FID and IS are not comparable with "
              f"published numbers.", file=sys.stderr, flush=True)
    return extract


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def check_features_informative(extract: FeatureFn, path: str, digest: str) -> None:
    """Weights of the right layout but the wrong content (zeros, a broken conversion) give every
    image the same features and flat logits, hence FID ~0 and IS 1. Two different images must give
    finite, different features and logits that prefer some class; else a ConfigError."""
    gen = torch.Generator().manual_seed(0)
    images = torch.stack([torch.zeros(3, 64, 64, dtype=torch.uint8),
                          torch.randint(0, 256, (3, 64, 64), generator=gen, dtype=torch.uint8)])  # [2, 3, 64, 64]
    features, logits = extract(images)                                                            # [2, D], [2, K]
    features, logits = features.double().cpu(), logits.double().cpu()
    spread = (features[0] - features[1]).abs().max().item() if torch.isfinite(features).all() else 0.0
    flat = not torch.isfinite(logits).all() or (logits.max(1).values - logits.min(1).values).max().item() < 1e-4
    if spread < 1e-4 or flat:
        raise ConfigError(f"'eval.inception_path' {path!r} has InceptionV3's layout but not its weights: two "
                          f"different images get the same features or no class preference, so FID would be ~0 and "
                          f"IS 1. Its sha256 begins {digest[:8]}, the known file's {INCEPTION_SHA256_PREFIX}: fetch "
                          f"{INCEPTION_URL} again.")


def extract_features(feature_fn: FeatureFn, images: np.ndarray, batch_size: int,
                     progress: bool = False, desc: str = "features") -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """uint8 images [N, H, W, 3] -> (features [N, D], logits [N, K] or None), float64 on the CPU."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"expected uint8 images [N, H, W, 3], got {images.dtype} {tuple(images.shape)}")
    starts = range(0, len(images), batch_size)
    if progress and len(starts) > 1:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=desc, unit="batch")
    features, logits = [], []
    for start in starts:
        batch = torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size])).permute(0, 3, 1, 2)
        f, lg = feature_fn(batch)                                          # [b, D], [b, K] or None
        features.append(f.double().cpu())
        if lg is not None:
            logits.append(lg.double().cpu())
    return torch.cat(features), (torch.cat(logits) if logits else None)
