"""The parts of a training run that do not depend on what is trained, shared by the trainers:
plugin and booster set-up, the boosted optimizer/scheduler/data loader, resuming, the endless
resumable batch stream, the optimizer step with EMA and the loss log point.

A trainer's own loop is then only "batch -> loss" plus these calls, in this order::

    plugin, booster = build_booster(cfg, info)
    model, optimizer, lr_scheduler, dataloader, micro_batch = boost_training(cfg, plugin, booster, model, dataset)
    seed_everything(cfg.global_seed, plugin.dp_rank, plugin.dp_size)
    ema_plugin = enable_ema(cfg, plugin, model, optimizer)
    step, epoch, batch_in_epoch = restore_training(cfg, booster, plugin, ema_plugin, model, optimizer, lr_scheduler, log)
"""

import os
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
import yaml
from colossalai.booster import Booster

from ..config import ConfigError, to_dict
from ..data.sampler import ResumableDistributedSampler
from ..plugins import OpenDiTPlugin
from ..plugins.checkpoint import load_checkpoint, load_ema_file
from .lr_schedule import warmup_scheduler
from .metrics import MetricsLogger
from .run_checkpoints import pick_resume_checkpoint


def build_booster(cfg, info) -> Tuple[OpenDiTPlugin, Booster]:
    """The plugin (it builds the data x sequence mesh the conversions need, so it comes first)."""
    try:
        plugin = OpenDiTPlugin(zero_degree=cfg.zero_degree, sp_size=cfg.sp_size, precision=cfg.precision,
                               grad_clip=cfg.grad_clip, group_zero=cfg.group_zero, node_size=info.local_world_size)
    except ValueError as e:  # a strategy this launch cannot run (e.g. Gemini without CUDA)
        raise ConfigError(str(e)) from None
    return plugin, Booster(plugin=plugin)


def boost_training(cfg, plugin: OpenDiTPlugin, booster: Booster, model, dataset):
    """AdamW, warm-up schedule and a resumable distributed loader, boosted together.

    Returns (model, optimizer, lr_scheduler, dataloader, micro_batch) where micro_batch =
    global_batch_size / (data-parallel ranks x grad_accum_steps) samples per rank and micro-step."""
    micro_batch = cfg.global_batch_size // (plugin.dp_size * cfg.grad_accum_steps)
    optimizer = plugin.build_optimizer(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                       fused=cfg.fused_optimizer)
    lr_scheduler = warmup_scheduler(optimizer, cfg.warmup_steps)
    dataloader = plugin.prepare_dataloader(dataset, batch_size=micro_batch, shuffle=True, seed=cfg.global_seed,
                                           drop_last=True, num_workers=cfg.num_workers, pin_memory=cfg.pin_memory,
                                           distributed_sampler_cls=ResumableDistributedSampler)
    if len(dataloader) == 0:
        raise ConfigError(f"The dataset has {len(dataset)} samples, fewer than one batch of {micro_batch} per "
                          f"data-parallel rank; lower global_batch_size or add data.")
    model, optimizer, _, dataloader, lr_scheduler = booster.boost(model, optimizer, dataloader=dataloader,
                                                                  lr_scheduler=lr_scheduler)
    return model, optimizer, lr_scheduler, dataloader, micro_batch


def enable_ema(cfg, plugin: OpenDiTPlugin, model, optimizer) -> Optional[OpenDiTPlugin]:
    """Create the (sharded) EMA when enabled; the plugin that holds it, or None."""
    if not cfg.ema.enable:
        return None
    plugin.create_ema(model, optimizer)
    return plugin


def restore_training(cfg, booster: Booster, plugin: OpenDiTPlugin, ema_plugin: Optional[OpenDiTPlugin], model,
                     optimizer, lr_scheduler, log: MetricsLogger) -> Tuple[int, int, int]:
    """Load the checkpoint chosen by resume_from/auto_resume (if any) and an explicit EMA file;
    returns (step, epoch, batch_in_epoch) to continue from, (0, 0, 0) for a fresh run."""
    step, epoch, batch_in_epoch = 0, 0, 0
    resume = pick_resume_checkpoint(cfg)
    if resume:
        state = load_checkpoint(booster, resume, model, optimizer, lr_scheduler, plugin=ema_plugin)
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        log.write(f"resumed from {resume} at step {step}")
    if ema_plugin is not None and cfg.ema.resume_from:  # an explicit EMA file wins over the checkpoint's
        load_ema_file(plugin, cfg.ema.resume_from)
    return step, epoch, batch_in_epoch


def write_run_config(cfg, run_dir: str, is_main: bool) -> None:
    """``<run dir>/config.yaml``: the resolved config of this run (model geometry filled in)."""
    if is_main:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(to_dict(cfg), f, sort_keys=False)


class ResumableBatches:
    """Endless batches from a loader whose sampler is a ``ResumableDistributedSampler``.

    ``epoch`` and ``batch_in_epoch`` count where the stream stands; saved with a checkpoint and
    passed back here they make a resumed run see exactly the batches the uninterrupted run would."""

    def __init__(self, dataloader, micro_batch: int, epoch: int = 0, batch_in_epoch: int = 0):
        self.dataloader, self.micro_batch = dataloader, micro_batch
        self.epoch, self.batch_in_epoch = epoch, batch_in_epoch
        self._iter = None

    def _start(self) -> None:
        self.dataloader.sampler.set_epoch(self.epoch)
        self.dataloader.sampler.set_start_index(self.batch_in_epoch * self.micro_batch)
        self._iter = iter(self.dataloader)

    def __iter__(self):
        return self

    def __next__(self):
        if self._iter is None:
            self._start()
        try:
            batch = next(self._iter)
        except StopIteration:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._start()
            batch = next(self._iter)
        self.batch_in_epoch += 1
        return batch


def optimizer_step(cfg, plugin: OpenDiTPlugin, ema_plugin: Optional[OpenDiTPlugin], model, optimizer,
                   lr_scheduler) -> None:
    """Step, clear gradients, advance the LR schedule, then update the EMA from the new weights."""
    optimizer.step()
    optimizer.zero_grad()
    lr_scheduler.step()
    if ema_plugin is not None:
        plugin.update_ema(model, optimizer, decay=cfg.ema.decay)


def log_mean_loss(log: MetricsLogger, step: int, sums: Dict[str, torch.Tensor], since_log: int,
                  samples_per_step: int, world_size: int, extra=None) -> None:
    """Average the accumulated losses over ranks, log them, and reset the sums (the loop's only sync)."""
    for value in sums.values():
        dist.all_reduce(value)
        value /= world_size
    log.log(step, sums, since_log, samples_per_step, extra=extra)
    for value in sums.values():
        value.zero_()
