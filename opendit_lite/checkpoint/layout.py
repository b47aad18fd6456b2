"""Where a run's checkpoints live and which one a script should load, shared by the trainers and
samplers: ``<results_dir>/<exp_name>/checkpoints/<exp_name>_step<N>/`` unless ``checkpoint_dir`` says
otherwise, and the resolved config stored with each checkpoint so that a sampler rebuilds exactly
the model that was trained."""

import json
import os
from typing import Any, Dict, Optional

from ..config import ConfigError
from .state import find_latest_checkpoint


def checkpoint_root(cfg) -> str:
    return cfg.checkpoint_dir or os.path.join(cfg.results_dir, cfg.exp_name, "checkpoints")


def pick_resume_checkpoint(cfg) -> Optional[str]:
    """LiteGen's priority: resume_from > auto_resume (newest complete checkpoint) > nothing."""
    if cfg.resume_from:
        return cfg.resume_from
    if cfg.auto_resume:
        return find_latest_checkpoint(checkpoint_root(cfg), cfg.exp_name)
    return None


def resolve_sample_checkpoint(cfg, ckpt: Optional[str], train_script: str) -> str:
    """``ckpt`` when given (it must exist), else the newest complete checkpoint of the run; a
    ConfigError says how to get one when there is none."""
    if ckpt:
        if not os.path.exists(ckpt):
            raise ConfigError(f"'sample.ckpt' {ckpt!r} does not exist.")
        return ckpt
    root = checkpoint_root(cfg)
    found = find_latest_checkpoint(root, cfg.exp_name) if os.path.isdir(root) else None
    if found is None:
        raise ConfigError(f"No complete checkpoint of experiment '{cfg.exp_name}' under '{root}'. Train first "
                          f"(python {train_script} with the same config) or pass sample.ckpt=<checkpoint folder>.")
    return found


def saved_config(ckpt: str) -> Dict[str, Any]:
    """The resolved config a trainer stored with checkpoint folder ``ckpt`` ({} for other formats)."""
    meta = os.path.join(ckpt, "meta.json")
    if not os.path.isfile(meta):
        return {}
    with open(meta) as f:
        return json.load(f).get("extra_state", {}).get("config", {})
