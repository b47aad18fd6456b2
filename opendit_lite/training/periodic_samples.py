"""``sample.every``: samples while training, so the user sees a run (a LoRA, most often) take shape and
stops it early.

Every ``sample.every`` steps the checkpoint just saved is sampled exactly as ``sample_video.py`` /
``sample.py`` would sample it (``sampling.video.sample_prompts``: a run from ``model.pipeline`` through
its pipeline with the run's exported weights loaded, the zoo's models with their own sampler; EMA
weights when the run keeps an EMA, as the export does), on the training ranks with the run's
sequence-parallel layout, into ``<run dir>/samples/step_<N>/`` (one file per prompt and
``contact_sheet.png``), and to TensorBoard / W&B as images (W&B also gets the videos). The prompts'
noise comes from ``sample.seed``, so every step's samples start from the same noise.

Training continues exactly as without sampling: the sampling model is built from the checkpoint apart
from the training model, and the random streams of the process (CPU and CUDA) are restored afterwards
(``torch.random.fork_rng``). The time it takes is logged.
"""

import copy
import os
import time
from typing import Callable, Optional

import torch

from ..config import ConfigError


def check_periodic_sampling(cfg) -> None:
    """``sample.every`` fits the run (before anything starts): a multiple of ``ckpt_every``, with prompts."""
    every, s = cfg.sample.every, cfg.sample
    if not every:
        return
    if not cfg.ckpt_every or every % cfg.ckpt_every:
        raise ConfigError(f"'sample.every'={every} samples the checkpoint saved at that step: it must be a positive "
                          f"multiple of 'ckpt_every' (now {cfg.ckpt_every}), e.g. ckpt_every={every} or "
                          f"sample.every={max(cfg.ckpt_every, 1) * 2}.")
    if not s.prompts and not s.prompt_file and cfg.text_encoder.kind != "shapes":
        raise ConfigError(f"'sample.every'={every} renders sample.prompts while training, but no prompts are given: "
                          f"set sample.prompts=[...] (a few fixed prompts that show what the run learns) or "
                          f"sample.prompt_file, or remove sample.every.")


def periodic_sampling(cfg, log) -> Optional[Callable[[int, str], None]]:
    """The ``after_save(step, checkpoint)`` hook for ``sample.every`` (None when it is 0)."""
    every = cfg.sample.every
    if not every:
        return None
    check_periodic_sampling(cfg)
    root = os.path.join(cfg.results_dir, cfg.exp_name, "samples")

    def sample_checkpoint(step: int, checkpoint: str) -> None:
        if step % every:
            return
        from ..sampling.video import sample_prompts  # the sampling machinery, once a step samples

        run_cfg = copy.deepcopy(cfg)  # sampling adopts the checkpoint's sections in place
        run_cfg.sample.ckpt = checkpoint
        run_cfg.sample.output_dir = os.path.join(root, f"step_{step}")
        start = time.perf_counter()
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):  # training's random streams as they were
            paths = sample_prompts(run_cfg)
        if not paths:  # the other ranks
            return
        seconds = time.perf_counter() - start
        log.record(step, {"sample/seconds": seconds})
        log.images(step, "samples", paths)
        log.write(f"sampled {len(paths) - 1} prompt(s) at step {step} in {seconds:.1f} s: "
                  f"{run_cfg.sample.output_dir}")

    return sample_checkpoint
