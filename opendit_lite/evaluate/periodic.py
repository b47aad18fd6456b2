"""``eval_every``: evaluate the checkpoint a training run just saved, every ``eval_every`` steps.

The samples come from the saved checkpoint (its EMA weights, as ``python -m opendit_lite.evaluate``
would use them), generated over all training ranks with the same data x sequence layout; rank 0
scores them while the other ranks go back to training and wait for it at the next collective, so
keep ``eval.samples_per_class`` small enough for the scoring to finish well within the process
group's timeout. The metrics go to metrics.jsonl and TensorBoard as ``eval/<name>``.
"""

import copy
import os
from typing import Callable, Optional

import torch

from ..config import ConfigError
from ..sampling import sampling_ranks
from .generate import generate_samples
from .run import check_eval_config, score


def periodic_evaluation(cfg, log) -> Optional[Callable[[int, str], None]]:
    """The ``after_save(step, checkpoint)`` hook for ``cfg.eval_every`` (None when it is 0)."""
    every = cfg.eval_every
    if not every:
        return None
    if not cfg.ckpt_every or every % cfg.ckpt_every != 0:
        raise ConfigError(f"'eval_every'={every} evaluates saved checkpoints: it must be a positive multiple of "
                          f"'ckpt_every' (now {cfg.ckpt_every}), e.g. eval_every={max(cfg.ckpt_every, 1) * 2}.")
    if not cfg.eval.reference or cfg.eval.samples:
        raise ConfigError("'eval_every' needs eval.reference (reference statistics or images) and "
                          "eval.inception_path, and generates its own samples (leave eval.samples unset).")
    check_eval_config(cfg)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.sample.cfg_parallel and world % (2 * cfg.sp_size):
        raise ConfigError(f"'sample.cfg_parallel' evaluates on groups of 2 x sp_size = {2 * cfg.sp_size} ranks, but "
                          f"this run has {world}: set sample.cfg_parallel=false for eval_every, or launch a multiple "
                          f"of {2 * cfg.sp_size} ranks.")
    root = cfg.eval.output_dir or os.path.join(cfg.results_dir, cfg.exp_name, "eval")

    def evaluate_checkpoint(step: int, checkpoint: str) -> None:
        if step % every != 0:
            return
        run_cfg = copy.deepcopy(cfg)  # sampling adopts the checkpoint's model section in place
        run_cfg.sample.ckpt = checkpoint
        out_dir = os.path.join(root, f"step{step}")
        # Building the sampling model draws initial weights: keep training's random stream untouched.
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices), sampling_ranks(cfg.sp_size, cfg.sample.cfg_parallel) as ranks:
            samples = generate_samples(run_cfg, ranks, out_dir)
            if not ranks.is_main:
                return
        metrics = score(run_cfg, samples, out_dir)
        log.record(step, {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, float)})
        log.write(f"evaluated {checkpoint}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()
                                                          if isinstance(v, float)))

    return evaluate_checkpoint
