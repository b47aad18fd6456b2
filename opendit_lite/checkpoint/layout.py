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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..distributed.ranks import from_rank0, global_rank
from ..errors import CheckpointError, ConfigError
from .catalog import META_FILE, check_meta_values, checkpoint_name, list_checkpoints, verify_checkpoint

# LiteGen's file suffixes, by what the file holds.
SUFFIXES = {"model": ".pth", "optimizer": ".optim_state.pth", "ema": ".ema.pth"}


def checkpoint_root(cfg) -> str:
    return cfg.checkpoint_dir or os.path.join(cfg.results_dir, cfg.exp_name, "checkpoints")


def newest_verified_checkpoint(root: str, exp_name: str, report: Callable[[str], None] = print) -> Optional[str]:
    """Collective: the newest checkpoint of ``exp_name`` under ``root`` whose files match its manifest
    (present, sizes, CRC-32), walking back from the newest; each one skipped is reported with the
    reason. Rank 0 reads the files and every rank gets its answer; None when none verifies."""
    chosen, skipped = None, []
    if global_rank() == 0:
        for _, path in reversed(list_checkpoints(root, exp_name)):
            try:
                verify_checkpoint(path)
            except (CheckpointError, OSError) as e:
                skipped.append(f"auto_resume: skipping {path}: {e}")
                continue
            chosen = path
            break
    chosen, skipped = from_rank0((chosen, skipped))
    if global_rank() == 0:
        for line in skipped:
            report(line)
    return chosen


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


def find_resume_checkpoint(root: str, exp_name: str, needs: Sequence[str] = (),
                           report: Callable[[str], None] = print) -> Optional[str]:
    """Collective: the newest resumable checkpoint of ``exp_name`` under ``root``: the newest
    checkpoint folder that verifies (``newest_verified_checkpoint``), or a newer LiteGen model file
    with its ``needs`` companions; at equal steps the folder (it holds more). None when there is none."""
    candidates = []
    folder = newest_verified_checkpoint(root, exp_name, report)
    if folder is not None:  # its step from the listing: a left-over ``*.old-*`` copy is named differently
        candidates.append((dict((p, n) for n, p in list_checkpoints(root, exp_name))[folder], 1, folder))
    candidates += [(step, 0, path) for step, path in list_litegen_checkpoints(root, exp_name, needs)]
    return max(candidates)[2] if candidates else None


def pick_resume_checkpoint(cfg, needs: Optional[Sequence[str]] = None,
                           report: Callable[[str], None] = print) -> Optional[str]:
    """LiteGen's priority: resume_from > auto_resume (the newest checkpoint that verifies) > nothing.
    ``needs``: the LiteGen companion files a model file must have to count (default: the optimizer,
    and the EMA when ``ema.enable``). Checkpoint folders that all fail to verify are an error, not
    a fresh start, unless ``overwrite`` says to start afresh."""
    if cfg.resume_from:
        return cfg.resume_from
    if cfg.auto_resume:
        if needs is None:
            needs = ("optimizer",) + (("ema",) if cfg.ema.enable else ())
        root = checkpoint_root(cfg)
        found = find_resume_checkpoint(root, cfg.exp_name, needs, report)
        damaged = marked_checkpoint_folders(root, cfg.exp_name)
        if found is None and damaged and not cfg.overwrite:
            raise CheckpointError(f"auto_resume: no checkpoint of experiment '{cfg.exp_name}' under {root!r} verifies: "
                                  f"{', '.join(os.path.basename(p) for p in damaged)} (the reason for each is above). "
                                  f"Restore one from a backup, or set overwrite=true to start afresh next to them.")
        return found
    return None


def marked_checkpoint_folders(root: str, exp_name: str) -> List[str]:
    """Folders ``<root>/<exp_name>_step<N>`` holding a ``meta.json``, readable or not: what was once
    published as a checkpoint (a folder without one is an interrupted save or prune)."""
    if not os.path.isdir(root):
        return []
    pattern = re.compile(rf"{re.escape(exp_name)}_step(\d+)")
    found = [(int(m.group(1)), os.path.join(root, name)) for name in os.listdir(root)
             if (m := pattern.fullmatch(name)) and os.path.isfile(os.path.join(root, name, META_FILE))]
    return [path for _, path in sorted(found)]


def wants_resume(cfg) -> bool:
    """Whether this run continues a checkpoint (cheap: no file is checksummed)."""
    return bool(cfg.resume_from) or (cfg.auto_resume and bool(marked_checkpoint_folders(checkpoint_root(cfg),
                                                                                         cfg.exp_name)))


def resolve_sample_checkpoint(cfg, ckpt: Optional[str], train_script: str) -> str:
    """``ckpt`` when given (it must exist), else the newest complete checkpoint of the run; a
    ConfigError says how to get one when there is none (``train_script`` trains the run)."""
    if ckpt:
        if not os.path.exists(ckpt):
            raise ConfigError(f"'sample.ckpt' {ckpt!r} does not exist. Pass a checkpoint folder "
                              f"(<results_dir>/<exp_name>/checkpoints/<exp_name>_step<N>), a LiteGen .pth file, or "
                              f"leave it empty for the newest checkpoint of exp_name.")
        return ckpt
    root = checkpoint_root(cfg)
    ckpt = find_resume_checkpoint(root, cfg.exp_name)
    if ckpt is None:
        raise ConfigError(f"No complete checkpoint of experiment '{cfg.exp_name}' under '{root}'. Train first "
                          f"(python {train_script} with the same config) or pass "
                          f"sample.ckpt=<checkpoint folder or .pth file>.")
    return ckpt


def saved_config(ckpt: str) -> Dict[str, Any]:
    """The resolved config a trainer stored with checkpoint folder ``ckpt`` ({} for other formats)."""
    meta = os.path.join(ckpt, "meta.json")
    if not os.path.isfile(meta):
        return {}
    try:
        with open(meta) as f:
            values = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {meta}: {e}") from None
    if not isinstance(values, dict):
        raise CheckpointError(f"{meta} is damaged: it holds a {type(values).__name__}, not checkpoint metadata")
    check_meta_values(values, meta)
    config = values.get("extra_state", {}).get("config", {})
    if not isinstance(config, dict):
        raise CheckpointError(f"{meta} is damaged: its extra_state.config is {config!r}, not the run's config")
    return config


def check_saved_model(ckpt: str, key: str, model_name: str) -> None:
    """A checkpoint folder whose saved config names a model other than ``model_name`` (the config's)
    is refused, naming both: training would load mismatched weights, and sampling would silently
    sample another model than the config says."""
    saved = saved_config(ckpt).get("model", {}).get("name") if os.path.isdir(ckpt) else None
    if saved is not None and saved != model_name:
        raise ConfigError(f"'{key}' {ckpt!r}: the checkpoint is {saved}, the config is {model_name}. Set "
                          f"model.name={saved} to use that model, or point '{key}' at a {model_name} checkpoint.")
