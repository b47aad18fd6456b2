"""The parts of a training run that do not depend on what is trained: plugin and booster set-up,
the boosted optimizer/scheduler/data loader, resuming, the endless resumable batch stream, and the
step loop (accumulation, optimizer step, EMA, logging, checkpoints). ``trainer.py`` calls them in
order for every trainer; a trainer itself only declares its data and model (``spec.py``).
"""

import contextlib
import os
import uuid
from typing import Callable, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
import yaml
from colossalai.booster import Booster

from ..checkpoint.layout import checkpoint_root, pick_resume_checkpoint
from ..checkpoint.resume import restore_run
from ..checkpoint.state import save_checkpoint
from ..config import ConfigError, to_dict
from ..data.sampler import ResumableDistributedSampler
from ..distributed.ranks import from_rank0
from ..errors import RunInterrupted
from ..optim.lr_schedule import build_lr_scheduler
from ..plugins import OpenDiTPlugin
from ..plugins.precision import resolve_precision
from ..precision import apply_fp8_training, check_fp8_supported
from .cuda_graphs import check_cuda_graphs
from .guard import NonFiniteGuard
from .hyperparams import apply_configured_hyperparams
from .metrics import MetricsLogger, peak_memory_gib
from .mfu import counted_flops, current_device_peak_tflops
from .stop import StopRequest


def build_booster(cfg, info) -> Tuple[OpenDiTPlugin, Booster]:
    """The plugin (it builds the data x sequence mesh the conversions need, so it comes first).

    ``precision=auto`` becomes bf16 on CUDA and fp32 on the CPU; tf32 is fp32 weights with TF32
    matmuls. ``grad_precision`` must be null or the parameter dtype: gradients are reduced in it."""
    precision = resolve_precision(cfg.precision, info.device.type)
    if (cfg.allow_tf32 or precision == "tf32") and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    check_cuda_graphs(cuda_graphs=cfg.cuda_graphs, compile=cfg.compile, device=info.device)
    if precision == "fp8":
        check_fp8_supported(info.device)  # ConfigError on CPU, pre-Ada GPUs or without torchao
    # tf32: fp32 weights, TF32 matmuls; fp8: bf16 everywhere but the blocks' Linear layers
    precision = {"tf32": "fp32", "fp8": "bf16"}.get(precision, precision)
    grad = "fp32" if cfg.grad_precision == "tf32" else cfg.grad_precision
    if grad not in (None, precision):
        raise ConfigError(f"'grad_precision'={cfg.grad_precision!r} is not supported: gradients are reduced in the "
                          f"parameter dtype, here {precision}. Remove grad_precision or set it to {precision}.")
    try:
        plugin = OpenDiTPlugin(zero_degree=cfg.zero_degree, sp_size=cfg.sp_size, precision=precision,
                               grad_clip=cfg.grad_clip, group_zero=cfg.group_zero, node_size=info.local_world_size)
    except ValueError as e:  # a strategy this launch cannot run (e.g. Gemini without CUDA)
        raise ConfigError(str(e)) from None
    return plugin, Booster(plugin=plugin)


def boost_training(cfg, plugin: OpenDiTPlugin, booster: Booster, model, dataset, batch_sampler=None):
    """AdamW, LR schedule and a resumable distributed loader, boosted together.

    Returns (model, optimizer, lr_scheduler, dataloader, micro_batch) where micro_batch =
    global_batch_size / (data-parallel ranks x grad_accum_steps) samples per rank and micro-step.
    A ``batch_sampler`` (e.g. ``data.buckets.BucketBatchSampler``, already sharded over the
    data-parallel ranks) replaces the distributed sampler; its batches set their own sizes."""
    micro_batch = cfg.global_batch_size // (plugin.dp_size * cfg.grad_accum_steps)
    if cfg.precision == "fp8":  # before the optimizer: Float8Linear keeps the Parameters, but swap first
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
                                                 pin_memory=cfg.pin_memory, generator=workers_seed)
    else:
        dataloader = plugin.prepare_dataloader(dataset, batch_size=micro_batch, shuffle=True, seed=cfg.global_seed,
                                               drop_last=True, num_workers=cfg.num_workers,
                                               pin_memory=cfg.pin_memory,
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


class Restored(NamedTuple):
    step: int
    position: dict  # the batch stream's saved state (epoch, batch_in_epoch, bucket cursors)
    run_id: str  # names this run's checkpoints: keep_last prunes only those
    flops_per_step: Optional[float]  # counted by the run's first step; None before it


def restore_training(cfg, booster: Booster, plugin: OpenDiTPlugin, ema_plugin: Optional[OpenDiTPlugin], model,
                     optimizer, lr_scheduler, log: MetricsLogger) -> Restored:
    """Load the checkpoint chosen by resume_from/auto_resume (if any) and the EMA (see
    ``checkpoint.resume.restore_run``); returns what to continue from: the step, the data position
    (what the batch stream's ``state_dict()`` saved: ``epoch``, ``batch_in_epoch``, a bucket
    sampler's cursors; zeros for a fresh run), the run id and the FLOPs per step counted by the
    run's first step (None: not yet). A resumed run applies the configured lr/weight_decay (and
    says so when they changed)."""
    resume = pick_resume_checkpoint(cfg, report=log.write)
    create_ema = (lambda: plugin.create_ema(model, optimizer)) if ema_plugin is not None else None
    state = restore_run(booster, model, optimizer, lr_scheduler, resume=resume, auto=not cfg.resume_from,
                        ema_resume_from=cfg.ema.resume_from, create_ema=create_ema)
    step, run_id = state.get("step", 0), state.get("run_id") or uuid.uuid4().hex
    position = {"epoch": 0, "batch_in_epoch": 0}
    position.update({k: v for k, v in state.items() if k not in ("step", "config", "run_id", "flops_per_step")})
    if resume:
        log.write(f"resumed from {resume} at step {step}")
        for change in apply_configured_hyperparams(optimizer, lr_scheduler, lr=cfg.lr, weight_decay=cfg.weight_decay):
            log.write(change)
    run_id = from_rank0(run_id)  # a fresh run: rank 0's new id on every rank
    return Restored(step, position, run_id, state.get("flops_per_step"))


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

    def state_dict(self) -> dict:
        """The position a checkpoint records: the next batch is ``batch_in_epoch`` of ``epoch``."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

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


def run_steps(cfg, info, log: MetricsLogger, booster: Booster, plugin: OpenDiTPlugin,
              ema_plugin: Optional[OpenDiTPlugin], model, optimizer, lr_scheduler, batches: ResumableBatches,
              step: int, batch_loss: Callable[[object, int], torch.Tensor], run_id: Optional[str] = None,
              after_save: Optional[Callable[[int, str], None]] = None,
              flops_per_step: Optional[float] = None) -> str:
    """Train from ``step`` to ``cfg.max_steps``; returns the final checkpoint's path.

    ``batch_loss(batch, step)`` maps one micro-batch of optimizer step ``step`` (0-based) to its mean
    loss (the trainer's only own part; the step keys the samples' random draws). Each
    optimizer step accumulates ``grad_accum_steps`` micro-batches, steps, advances the LR schedule
    and updates the EMA. Losses stay on the device and are averaged over ranks only every
    ``log_every`` steps (the one host sync); checkpoints every ``ckpt_every`` steps and at the end
    record the data position so a resumed run continues with the next batch. A non-finite loss
    stops the run before any later checkpoint (``guard.py``). A first Ctrl-C or SIGTERM stops the
    run at a step boundary with a checkpoint and raises ``RunInterrupted`` (see ``stop.py``).
    ``after_save(step, path)`` runs on every rank after each checkpoint (e.g. ``eval_every``).
    ``flops_per_step``: this rank's FLOPs per optimizer step as counted by the run's first step
    (a resumed run passes the saved count: counting runs the step under a dispatch mode, which
    may change its rounding, so only the first step of a run is ever counted)."""
    guard = NonFiniteGuard(info.device, cfg.nan_policy)

    def save(at_step: int) -> str:
        guard.check_before_save(at_step, model)
        extra = {**batches.state_dict(), "config": to_dict(cfg), "run_id": run_id}
        if flops_per_step is not None:
            extra["flops_per_step"] = flops_per_step
        path = save_checkpoint(booster, checkpoint_root(cfg), at_step, model, optimizer, lr_scheduler,
                               ema=ema_plugin.ema if ema_plugin is not None else None, extra_state=extra,
                               keep_last=cfg.keep_last or None,
                               exp_name=cfg.exp_name, run_id=run_id)
        log.write(f"saved checkpoint {path}")
        if after_save is not None:
            after_save(at_step, path)
        return path

    def micro_step(last: bool) -> torch.Tensor:
        # Gradients are reduced once, with the last micro-batch, where the strategy can defer it.
        defer = not last and plugin.support_no_sync()
        with booster.no_sync(model, optimizer) if defer else contextlib.nullcontext():
            loss = batch_loss(next(batches), step)
            booster.backward(loss / cfg.grad_accum_steps, optimizer)
        return loss.detach()

    loss_sum = torch.zeros((), device=info.device)
    since_log = 0
    peak_tflops = current_device_peak_tflops(info.device)
    log.start(step, cfg.max_steps)
    model.train()
    stopped = False
    try:  # the progress bar and metrics files are closed whichever way the run ends
        with StopRequest() as stop:  # Ctrl-C / SIGTERM: stop at the next agreed step boundary, after saving
            while step < cfg.max_steps:
                step_loss = torch.zeros((), device=info.device)
                for i in range(cfg.grad_accum_steps):
                    last = i == cfg.grad_accum_steps - 1
                    if flops_per_step is None and step == 0 and not cfg.compile:  # not inside compilation
                        loss, flops = counted_flops(lambda: micro_step(last))
                        flops_per_step = flops * cfg.grad_accum_steps
                    else:
                        loss = micro_step(last)
                    step_loss += loss / cfg.grad_accum_steps
                if guard.policy == "skip_step" and guard.should_skip(step + 1, step_loss):
                    optimizer.zero_grad()
                    log.write(f"non-finite loss: skipped the update of step {step + 1} ({guard.skipped} so far)")
                    continue
                guard.observe(step + 1, step_loss)
                loss_sum += step_loss
                optimizer.step()
                optimizer.zero_grad()
                last_lr = lr_scheduler.get_last_lr()[0]  # the LR this step used
                lr_scheduler.step()
                if ema_plugin is not None:
                    plugin.update_ema(model, optimizer, decay=cfg.ema.decay)
                step += 1
                since_log += 1
                log.advance()
                if step % cfg.log_every == 0 or step == cfg.max_steps:
                    # one all-reduce for the loss, the stop votes and the non-finite flags
                    stats = torch.stack([loss_sum, stop.flag_like(loss_sum), guard.flag_like(loss_sum)])
                    dist.all_reduce(stats)
                    guard.raise_if_flagged(stats[2].item())
                    grad_norm = optimizer.get_grad_norm()  # the last step's, before clipping (None: not tracked)
                    log.log(step, {"loss": stats[0] / info.world_size}, since_log, cfg.global_batch_size,
                            extra={"lr": last_lr, "grad_norm": None if grad_norm is None else float(grad_norm),
                                   "mem_gib": peak_memory_gib(info.device), "epoch": batches.epoch},
                            flops_per_step=flops_per_step, peak_tflops=peak_tflops)
                    loss_sum.zero_()
                    since_log = 0
                    stopped = step < cfg.max_steps and stats[1].item() > 0  # some rank got a stop signal
                elif step < cfg.max_steps:
                    stopped = stop.agreed(step, loss_sum)
                if stopped:
                    log.write(f"stop requested: saving at step {step}; continue with auto_resume=true")
                    break
                if cfg.ckpt_every and step % cfg.ckpt_every == 0 and step < cfg.max_steps:
                    save(step)
        path = save(step)
    finally:
        log.close()
    if stopped:
        raise RunInterrupted(f"a stop signal was honoured at step {step} of {cfg.max_steps}; the checkpoint {path} "
                             f"holds everything: rerun the same command with auto_resume=true to continue.")
    return path
