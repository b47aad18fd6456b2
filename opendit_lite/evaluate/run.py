"""The two halves of an evaluation run shared by the command and ``eval_every``: checking the
``eval.*`` settings before any sampling, and scoring a samples file on rank 0."""

import json
import os

import torch

from .features import load_inception
from .images import check_images_file, load_images
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
    if e.score:
        load_inception(e.inception_path, "cpu")  # exits with where to put the weights, or why they are wrong


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
    feature_fn = load_inception(e.inception_path, device)
    reference = None
    if e.reference:
        reference = load_reference(e.reference, feature_fn, e.batch_size, need_features=e.precision_recall,
                                   progress=True)
    metrics = score_images(load_images(samples_path), reference, feature_fn, e.batch_size,
                           precision_recall=e.precision_recall, progress=True)
    metrics.update(samples=samples_path, reference=e.reference)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(json.dumps(metrics))
    return metrics


