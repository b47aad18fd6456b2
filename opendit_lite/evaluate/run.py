"""The two halves of an evaluation run shared by the command and ``eval_every``: checking the
``eval.*`` settings before any sampling, and scoring a samples file on rank 0."""

import json
import os

import torch

from ..errors import ConfigError
from .features import FeatureFn, load_inception
from .images import check_images_file, load_images, npz_arrays
from .metrics import score_images
from .reference import check_reference_file, load_reference
from .settings import check_eval_settings


def check_eval_config(cfg) -> None:
    """What can be checked before sampling starts, so a bad setting does not cost a sampling run."""
    check_eval_settings(cfg)
    e = cfg.eval
    if e.samples:
        check_images_file(e.samples)  # the files' formats from their headers: cheap, so first
    if e.reference:
        check_reference_file(e.reference)
    if e.features == "shapes":
        check_shapes_inputs(cfg)
    if e.score:
        load_features(e, "cpu")  # exits with where to put the weights, or why they are wrong


def load_features(e, device) -> FeatureFn:
    """The feature network ``eval.features`` names: InceptionV3 from ``eval.inception_path``, or the
    shapes network shipped with the package (``shapes_features.py``)."""
    if e.features == "shapes":
        from .shapes_features import load_shapes_features

        return load_shapes_features(device)
    return load_inception(e.inception_path, device)


def check_shapes_inputs(cfg) -> None:
    """The shapes features score the shapes data's size only: the config's images, the samples file and
    reference images of another size are refused before anything is sampled."""
    from .shapes_features import check_shapes_size

    e = cfg.eval
    if e.samples:
        height, width = check_images_file(e.samples)[1:3]
        check_shapes_size(height, width, f"the images of eval.samples {e.samples!r}")
    elif cfg.data.type != "shapes" or cfg.vae.path:
        raise ConfigError(f"eval.features=shapes scores samples of the embedded shapes data, but this config trains on "
                          f"data.type={cfg.data.type!r}{' through a VAE' if cfg.vae.path else ''}: use "
                          f"eval.features=inception with eval.inception_path.")
    else:
        check_shapes_size(cfg.data.image_size, cfg.data.image_size, "this config's images (data.image_size)")
    if e.reference and not os.path.isdir(e.reference) and "arr_0" in npz_arrays(e.reference):
        height, width = check_images_file(e.reference)[1:3]
        check_shapes_size(height, width, f"the images of eval.reference {e.reference!r}")


def score(cfg, samples_path: str, out_dir: str) -> dict:
    """Metrics of the .npz at ``samples_path`` per ``cfg.eval`` (no reference: Inception Score only;
    ``eval.score=false``: nothing), written to ``<out_dir>/metrics.json`` and printed."""
    e = cfg.eval
    if not e.score:
        print(f"wrote {samples_path} (eval.score=false: not scored)")
        return {}
    if not e.reference:
        print("no eval.reference: computing the Inception Score only")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    feature_fn = load_features(e, device)
    reference = None
    if e.reference:
        reference = load_reference(e.reference, feature_fn, e.batch_size, need_features=e.precision_recall,
                                   progress=True)
    metrics = score_images(load_images(samples_path), reference, feature_fn, e.batch_size,
                           precision_recall=e.precision_recall, progress=True)
    metrics.update(samples=samples_path, reference=e.reference, features=e.features)  # FIDs compare within one
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(json.dumps(metrics))
    return metrics


