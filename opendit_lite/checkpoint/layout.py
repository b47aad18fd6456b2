"""Where a run's checkpoints live and which one to resume or sample from, shared by the trainers,
the samplers and LiteGen: the checkpoint folder is ``checkpoint_dir``, by default
``<results_dir>/<exp_name>/checkpoints/``, and holds two kinds of checkpoints of step ``N``:

- ``<exp_name>_step<N>/``: a folder written by ``state.save_checkpoint`` (model, optimizer, EMA,
  LR scheduler, RNG, extra state and the resolved config, so that a sampler rebuilds exactly the
  model that was trained);
- LiteGen's files ``<exp_name>_step<N>.pth`` (model state dict), ``.optim_state.pth`` (optimizer:
  a file under DDP, a folder of shards under ZeRO) and ``.ema.pth`` (fp32 EMA), written by
  ``LiteGen.save_model/save_optimizer/save_ema``.

One scan (:func:`find_resume_checkpoint`) picks the newest complete checkpoint of either kind.
"""

import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..config import ConfigError
from .state import checkpoint_name, list_checkpoints

# LiteGen's file suffixes, by what the file holds.
SUFFIXES = {"model": ".pth", "optimizer": ".optim_state.pth", "ema": ".ema.pth"}


def checkpoint_root(cfg) -> str:
    return cfg.checkpoint_dir or os.path.join(cfg.results_dir, cfg.exp_name, "checkpoints")


def litegen_path(kind: str, folder: str, exp_name: str, filename: Optional[str] = None,
                 step: Optional[int] = None) -> str:
    """Where LiteGen's ``save_<kind>`` writes: ``folder/filename``, else
    ``folder/[exp_name](_step[N])<suffix>`` with the suffix of ``kind`` (``SUFFIXES``)."""
    if filename is None:
        prefix = exp_name if step is None else checkpoint_name(exp_name, step)
        filename = prefix + SUFFIXES[kind]
    return os.path.join(folder, filename)


def companion_path(model_path: str, kind: str) -> str:
    """The ``kind`` file saved next to a LiteGen model file: ``X.pth`` -> ``X.optim_state.pth`` / ``X.ema.pth``."""
    model_path = model_path.rstrip("/")
    base = model_path[: -len(".pth")] if model_path.endswith(".pth") else model_path
    return base + SUFFIXES[kind]


def step_of(path: str) -> Optional[int]:
    """N of a checkpoint named ``..._step<N>`` (folder or ``.pth`` file), else None."""
    match = re.search(r"_step(\d+)(\.pth)?$", path.rstrip("/"))
    return int(match.group(1)) if match else None


def list_litegen_checkpoints(root: str, exp_name: str, needs: Sequence[str] = ()) -> List[Tuple[int, str]]:
    """LiteGen model files ``<root>/<exp_name>_step<N>.pth`` whose ``needs`` companions ("optimizer",
    "ema") exist, as ``(N, path)``, oldest first. A save killed midway left only a temporary name,
    which never matches."""
    if not os.path.isdir(root):
        return []
    pattern = re.compile(rf"{re.escape(exp_name)}_step(\d+)\.pth")
    found = []
    for name in os.listdir(root):
        match, path = pattern.fullmatch(name), os.path.join(root, name)
        if match and os.path.isfile(path) and all(os.path.exists(companion_path(path, k)) for k in needs):
            found.append((int(match.group(1)), path))
    return sorted(found)


def find_resume_checkpoint(root: str, exp_name: str, needs: Sequence[str] = ()) -> Optional[str]:
    """The newest complete checkpoint of ``exp_name`` under ``root``: a checkpoint folder, or a
    LiteGen model file with its ``needs`` companions; at equal steps the folder (it holds more)."""
    candidates = [(step, 1, path) for step, path in list_checkpoints(root, exp_name)]
    candidates += [(step, 0, path) for step, path in list_litegen_checkpoints(root, exp_name, needs)]
    return max(candidates)[2] if candidates else None


def pick_resume_checkpoint(cfg, needs: Optional[Sequence[str]] = None) -> Optional[str]:
    """LiteGen's priority: resume_from > auto_resume (newest complete checkpoint) > nothing.
    ``needs``: the LiteGen companion files a model file must have to count (default: the
    optimizer, and the EMA when ``ema.enable``)."""
    if cfg.resume_from:
        return cfg.resume_from
    if cfg.auto_resume:
        if needs is None:
            needs = ("optimizer",) + (("ema",) if cfg.ema.enable else ())
        return find_resume_checkpoint(checkpoint_root(cfg), cfg.exp_name, needs)
    return None


def resolve_sample_checkpoint(cfg, ckpt: Optional[str], train_script: str) -> str:
    """``ckpt`` when given (it must exist), else the newest complete checkpoint of the run; a
    ConfigError says how to get one when there is none."""
    if ckpt:
        if not os.path.exists(ckpt):
            raise ConfigError(f"'sample.ckpt' {ckpt!r} does not exist.")
        return ckpt
    root = checkpoint_root(cfg)
    found = find_resume_checkpoint(root, cfg.exp_name)
    if found is None:
        raise ConfigError(f"No complete checkpoint of experiment '{cfg.exp_name}' under '{root}'. Train first "
                          f"(python {train_script} with the same config) or pass sample.ckpt=<checkpoint folder or .pth file>.")
    return found


def saved_config(ckpt: str) -> Dict[str, Any]:
    """The resolved config a trainer stored with checkpoint folder ``ckpt`` ({} for other formats)."""
    meta = os.path.join(ckpt, "meta.json")
    if not os.path.isfile(meta):
        return {}
    with open(meta) as f:
        return json.load(f).get("extra_state", {}).get("config", {})
