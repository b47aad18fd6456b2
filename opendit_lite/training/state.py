"""The state of a training run as one object: built once by ``build_train_state``, restored into
from a checkpoint by ``restore_train_state``, stepped by ``loop.run_steps`` and saved with every
checkpoint by ``save_train_state``.

    state = build_train_state(cfg, plugin, booster, model, dataset)   # boosted, EMA built from the weights
    restore_train_state(state, cfg, booster, log)                     # resume_from / auto_resume, if any
    run_steps(state, cfg, booster, log, batch_loss, device=...)        # state.step -> cfg.max_steps
"""

import uuid
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch
from colossalai.booster import Booster

from ..builders.batch import micro_batch_size
from ..checkpoint.layout import checkpoint_root, pick_resume_checkpoint
from ..checkpoint.resume import restore_run
from ..checkpoint.save_restore import save_checkpoint
from ..config import ConfigError, to_dict
from ..data.buckets import BucketBatches
from ..data.resumable_sampler import ResumableBatches, ResumableDistributedSampler
from ..distributed.ranks import from_rank0
from ..ema import ShardedEMA
from ..optim.lr_schedule import build_lr_scheduler
from ..plugins import OpenDiTPlugin
from ..precision import apply_fp8_training
from .hyperparams import apply_configured_hyperparams
from .telemetry import MetricsLogger

# Keys of a checkpoint's extra state that are not the batch stream's position.
_NOT_POSITION = ("step", "config", "run_id", "flops_per_step")


class BatchStream(Protocol):
    """Endless batches whose position a checkpoint records (``ResumableBatches``, ``BucketBatches``)."""

    epoch: int

    def __next__(self) -> Any: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, position: dict) -> None: ...


@dataclass
class TrainState:
    """Everything a training run advances and a checkpoint saves (besides the RNG states, which the
    checkpoint takes from the process)."""

    model: Any                               # boosted (ModelWrapper)
    optimizer: Any                           # boosted (OptimizerWrapper)
    lr_scheduler: Any
    batches: BatchStream                     # the data: its sampler's position is part of the state
    ema: Optional[ShardedEMA] = None         # None: ema.enable is off
    step: int = 0                            # optimizer steps taken
    run_id: str = ""                         # names this run's checkpoints: keep_last prunes only those
    flops_per_step: Optional[float] = None   # this rank's, counted by the run's first step; None before it

    def extra_state(self) -> dict:
        """What a checkpoint records of the state besides model, optimizer, scheduler and EMA: the
        batch stream's position (``epoch``, ``batch_in_epoch``, a bucket sampler's cursors), the run
        id and the FLOPs per step once counted."""
        extra = {**self.batches.state_dict(), "run_id": self.run_id}
        if self.flops_per_step is not None:
            extra["flops_per_step"] = self.flops_per_step
        return extra

    def load_extra_state(self, saved: dict) -> None:
        """The inverse of ``extra_state`` (plus ``step``), from a checkpoint's extra state ({}: a fresh
        run, which gets a new run id)."""
        self.step = saved.get("step", 0)
        self.batches.load_state_dict({k: v for k, v in saved.items() if k not in _NOT_POSITION})
        self.run_id = saved.get("run_id") or uuid.uuid4().hex
        self.flops_per_step = saved.get("flops_per_step")


def build_train_state(cfg, plugin: OpenDiTPlugin, booster: Booster, model, dataset,
                      batch_sampler=None, collate=None) -> TrainState:
    """Boost ``model`` with AdamW, the LR schedule and a resumable distributed loader, and build the
    EMA (``ema.enable``) from its weights: the state of a fresh run at step 0.

    The loader gives ``micro_batch_size(cfg, dp_size)`` samples per rank and micro-step. A
    ``batch_sampler`` (e.g. ``data.buckets.BucketBatchSampler``, already sharded over the
    data-parallel ranks) replaces the distributed sampler; its batches set their own sizes."""
    micro_batch = micro_batch_size(cfg, plugin.dp_size)
    if plugin.precision.fp8:  # before the optimizer: Float8Linear keeps the Parameters, but swap first
        apply_fp8_training(model)
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    optimizer = plugin.build_optimizer(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                       fused=cfg.fused_optimizer, fused_ema=cfg.fused_optimizer_ema and cfg.ema.enable)
    lr_scheduler = build_lr_scheduler(optimizer, schedule=cfg.lr_schedule, warmup_steps=cfg.warmup_steps,
                                      total_steps=cfg.max_steps, min_lr_ratio=cfg.min_lr_ratio)
    if batch_sampler is not None:
        # Workers seeded per data-parallel rank as prepare_dataloader does; the loader's own generator
        # also keeps iter() from drawing on the global RNG, which a resumed run restores.
        workers_seed = torch.Generator().manual_seed(cfg.global_seed + plugin.dp_rank)
        dataloader = torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler, num_workers=cfg.num_workers,
                                                 pin_memory=cfg.pin_memory, generator=workers_seed, collate_fn=collate)
    else:
        dataloader = plugin.prepare_dataloader(dataset, batch_size=micro_batch, shuffle=True, seed=cfg.global_seed,
                                               drop_last=True, num_workers=cfg.num_workers,
                                               pin_memory=cfg.pin_memory,
                                               distributed_sampler_cls=ResumableDistributedSampler, collate_fn=collate)
    if len(dataloader) == 0:
        raise ConfigError(f"The dataset has {len(dataset)} samples, fewer than one batch of {micro_batch} per "
                          f"data-parallel rank; lower global_batch_size or add data.")
    model, optimizer, _, dataloader, lr_scheduler = booster.boost(model, optimizer, dataloader=dataloader,
                                                                  lr_scheduler=lr_scheduler)
    batches = BucketBatches(dataloader) if batch_sampler is not None else ResumableBatches(dataloader, micro_batch)
    ema = plugin.create_ema(model, optimizer) if cfg.ema.enable else None  # the one EMA of the run
    return TrainState(model, optimizer, lr_scheduler, batches, ema=ema)


def restore_train_state(state: TrainState, cfg, booster: Booster, log: MetricsLogger) -> Optional[str]:
    """Collective: load the checkpoint chosen by resume_from/auto_resume (if any) into ``state``
    (``checkpoint.resume.restore_run``: model, optimizer, scheduler, EMA, RNG, then the step, the
    batch stream's position, the run id and the FLOPs per step). A fresh run keeps step 0 and gets
    rank 0's new run id. A resumed run applies the configured lr/weight_decay (and says so when they
    changed). Returns the checkpoint resumed from, or None."""
    resume = pick_resume_checkpoint(cfg, report=log.write)
    saved = restore_run(booster, state.model, state.optimizer, state.lr_scheduler, ema=state.ema, resume=resume,
                        auto=not cfg.resume_from, ema_resume_from=cfg.ema.resume_from)
    state.load_extra_state(saved)
    state.run_id = from_rank0(state.run_id)  # a fresh run: rank 0's new id on every rank
    if resume is None and cfg.auto_resume:
        log.write(f"auto_resume: no checkpoint of experiment '{cfg.exp_name}' yet, starting from step 0")
    if resume:
        log.write(f"resumed from {resume} at step {state.step}")
        for change in apply_configured_hyperparams(state.optimizer, state.lr_scheduler, lr=cfg.lr,
                                                   weight_decay=cfg.weight_decay):
            log.write(change)
    return resume


def save_train_state(state: TrainState, cfg, booster: Booster) -> str:
    """Collective: write ``state`` at ``state.step`` as a checkpoint folder of the run (with the
    resolved config; ``keep_last`` prunes this run's older ones); returns its path."""
    extra = {**state.extra_state(), "config": to_dict(cfg)}
    return save_checkpoint(booster, checkpoint_root(cfg), state.step, state.model, state.optimizer,
                           state.lr_scheduler, ema=state.ema, extra_state=extra, keep_last=cfg.keep_last or None,
                           exp_name=cfg.exp_name, run_id=state.run_id)
