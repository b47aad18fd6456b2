"""Where a run's checkpoints live and which one a script should load, shared by the trainers and
samplers: ``<results_dir>/<exp_name>/checkpoints/<exp_name>_step<N>/`` unless ``checkpoint_dir`` says
otherwise, and the resolved config stored with each checkpoint so that a sampler rebuilds exactly
the model that was trained."""

import json
import os
from typing import Any, Callable, Dict, Optional

from ..config import ConfigError
from .state import CheckpointError, _from_rank0, _rank, find_latest_checkpoint, list_checkpoints, verify_checkpoint


def checkpoint_root(cfg) -> str:
    return cfg.checkpoint_dir or os.path.join(cfg.results_dir, cfg.exp_name, "checkpoints")


def newest_verified_checkpoint(root: str, exp_name: str, report: Callable[[str], None] = print) -> Optional[str]:
    """Collective: the newest checkpoint of ``exp_name`` under ``root`` whose files match its manifest
    (present, sizes, CRC-32), walking back from the newest; each one skipped is reported with the
    reason. Rank 0 reads the files and every rank gets its answer; None when none verifies."""
    chosen, skipped = None, []
    if _rank() == 0:
        for _, path in reversed(list_checkpoints(root, exp_name)):
            try:
                verify_checkpoint(path)
            except (CheckpointError, OSError) as e:
                skipped.append(f"auto_resume: skipping {path}: {e}")
                continue
            chosen = path
            break
    chosen, skipped = _from_rank0((chosen, skipped))
    if _rank() == 0:
        for line in skipped:
            report(line)
    return chosen


def pick_resume_checkpoint(cfg, report: Callable[[str], None] = print) -> Optional[str]:
    """LiteGen's priority: resume_from > auto_resume (newest checkpoint that verifies) > nothing."""
    if cfg.resume_from:
        return cfg.resume_from
    if cfg.auto_resume:
        root = checkpoint_root(cfg)
        found = newest_verified_checkpoint(root, cfg.exp_name, report)
        if found is None and list_checkpoints(root, cfg.exp_name):
            raise CheckpointError(f"auto_resume: no checkpoint of experiment '{cfg.exp_name}' under {root!r} verifies "
                                  f"(each one skipped is listed above); restore one from a backup, or move them away "
                                  f"to start afresh.")
        return found
    return None


def wants_resume(cfg) -> bool:
    """Whether this run continues a checkpoint (cheap: no file is read)."""
    return bool(cfg.resume_from) or (cfg.auto_resume and bool(list_checkpoints(checkpoint_root(cfg), cfg.exp_name)))


def resolve_sample_checkpoint(cfg, ckpt: Optional[str], train_script: str, family: str) -> str:
    """``ckpt`` when given (it must exist), else the newest complete checkpoint of the run; a
    ConfigError says how to get one when there is none, or when it holds a model of another
    ``family`` than the sampler's ("image"/"video")."""
    if ckpt:
        if not os.path.exists(ckpt):
            raise ConfigError(f"'sample.ckpt' {ckpt!r} does not exist. Pass a checkpoint folder "
                              f"(<results_dir>/<exp_name>/checkpoints/<exp_name>_step<N>) or leave it empty for the "
                              f"newest checkpoint of exp_name.")
    else:
        root = checkpoint_root(cfg)
        ckpt = find_latest_checkpoint(root, cfg.exp_name) if os.path.isdir(root) else None
        if ckpt is None:
            raise ConfigError(f"No complete checkpoint of experiment '{cfg.exp_name}' under '{root}'. Train first "
                              f"(python {train_script} with the same config) or pass sample.ckpt=<checkpoint folder>.")
    if os.path.isdir(ckpt):
        check_sample_checkpoint(ckpt, family, "sample.py" if family == "image" else "sample_video.py")
    return ckpt


def check_sample_checkpoint(ckpt: str, family: str, script: str) -> None:
    """A checkpoint folder given to a sampler holds a model of the sampler's family ("image"/"video")."""
    from ..models import MODELS
    from ..models.capabilities import model_family

    name = saved_config(ckpt).get("model", {}).get("name")
    if name in MODELS and model_family(name) != family:
        other = "sample_video.py" if model_family(name) == "video" else "sample.py"
        raise ConfigError(f"{ckpt!r} holds {name}, a {model_family(name)} model; {script} samples {family} models. "
                          f"Sample it with {other} (same config), or pass a checkpoint of a {family} model.")


def saved_config(ckpt: str) -> Dict[str, Any]:
    """The resolved config a trainer stored with checkpoint folder ``ckpt`` ({} for other formats)."""
    meta = os.path.join(ckpt, "meta.json")
    if not os.path.isfile(meta):
        return {}
    try:
        with open(meta) as f:
            return json.load(f).get("extra_state", {}).get("config", {})
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"cannot read {meta}: {e}") from None
