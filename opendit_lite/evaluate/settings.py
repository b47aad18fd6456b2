"""The checks of the ``eval.*`` settings that need no model and no torch, made before anything is
imported or sampled (``python -m opendit_lite.evaluate`` runs them first)."""

import os

from ..config.paths import check_output_path
from ..errors import ConfigError


def check_eval_settings(cfg) -> None:
    """The files ``eval.*`` names exist, the settings fit together, and the output folder can be written."""
    e = cfg.eval
    if e.samples and not os.path.isfile(e.samples):
        raise ConfigError(f"'eval.samples' {e.samples!r} does not exist.")
    if e.reference and not os.path.exists(e.reference):
        raise ConfigError(f"'eval.reference' {e.reference!r} does not exist.")
    if e.precision_recall and not e.reference:
        raise ConfigError("'eval.precision_recall' compares with reference images: set eval.reference.")
    if not e.score and (e.reference or e.precision_recall):
        raise ConfigError("'eval.score'=false only writes samples, but eval.reference / eval.precision_recall ask "
                          "for metrics: remove them, or set eval.score=true with eval.inception_path.")
    if e.features == "shapes" and e.inception_path:
        raise ConfigError(f"eval.features=shapes scores with the shapes network shipped with the package, so "
                          f"'eval.inception_path' {e.inception_path!r} would not be used: remove it, or set "
                          f"eval.features=inception to score with InceptionV3.")
    check_output_path(e.output_dir or os.path.join(cfg.results_dir, cfg.exp_name), "eval.output_dir" if e.output_dir
                      else "results_dir", folder=True)
