"""The parts of a training run that do not depend on what is trained: plugin and booster set-up
(with the precision resolved once), the run's config file, and the step loop (accumulation,
optimizer step, EMA, logging, checkpoints) over a ``TrainState`` (``state.py``). ``trainer.py``
calls them in order for every trainer; a trainer itself only declares its data and model (``spec.py``).
"""

import contextlib
import os
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist
import yaml
from colossalai.booster import Booster

from ..config import ConfigError, to_dict
from ..ema import ema_decay, ema_warmup_on, update_sharded_ema
from ..errors import RunInterrupted
from ..kernels.kernel_choice import first_step_context
from ..plugins import OpenDiTPlugin
from ..precision import check_fp8_supported, resolve_precision
from .cuda_graphs import check_cuda_graphs
from .guard import NonFiniteGuard
from .mfu import counted_flops, current_device_peak_tflops
from .state import TrainState, save_train_state
from .stop import StopRequest
from .telemetry import MetricsLogger, peak_memory_gib


def build_booster(cfg, info, find_unused_parameters: bool = False) -> Tuple[OpenDiTPlugin, Booster]:
    """The plugin (it builds the data x sequence mesh the conversions need, so it comes first).

    The precision is resolved here, once, into the ``Precision`` the plugin keeps
    (``plugin.precision``: ``auto`` is bf16 on CUDA and fp32 on the CPU; TF32 matmuls with tf32 or
    ``allow_tf32``; fp8 checked against the device). ``grad_precision`` must be null or the
    parameter dtype: gradients are reduced in it. ``find_unused_parameters``: DDP's (a model whose steps
    leave some trainable parameters out, as distillation's)."""
    precision = resolve_precision(cfg.precision, info.device.type, allow_tf32=cfg.allow_tf32)
    check_cuda_graphs(cuda_graphs=cfg.cuda_graphs, compile=cfg.compile, device=info.device)
    if precision.fp8:
        check_fp8_supported(info.device)  # ConfigError on CPU, pre-Ada GPUs or without torchao
    grad = "fp32" if cfg.grad_precision == "tf32" else cfg.grad_precision
    if grad not in (None, precision.dtype_name):
        raise ConfigError(f"'grad_precision'={cfg.grad_precision!r} is not supported: gradients are reduced in the "
                          f"parameter dtype, here {precision.dtype_name}. Remove grad_precision or set it to "
                          f"{precision.dtype_name}.")
    try:
        plugin = OpenDiTPlugin(zero_degree=cfg.zero_degree, sp_size=cfg.sp_size, precision=precision,
                               grad_clip=cfg.grad_clip, group_zero=cfg.group_zero, node_size=info.local_world_size,
                               gemini_offload_optim_frac=cfg.memory.gemini_offload_optim_frac,
                               ddp_kwargs=dict(find_unused_parameters=True) if find_unused_parameters else None)
    except ValueError as e:  # a strategy this launch cannot run (e.g. Gemini without CUDA)
        raise ConfigError(str(e)) from None
    return plugin, Booster(plugin=plugin)


def write_run_config(cfg, run_dir: str, is_main: bool) -> None:
    """``<run dir>/config.yaml``: the resolved config of this run (model geometry filled in)."""
    if is_main:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(to_dict(cfg), f, sort_keys=False)


def run_steps(state: TrainState, cfg, booster: Booster, log: MetricsLogger,
              batch_loss: Callable[[object, int], torch.Tensor], *, device: torch.device,
              after_save: Optional[Callable[[int, str], None]] = None) -> str:
    """Train ``state`` from ``state.step`` to ``cfg.max_steps``; returns the final checkpoint's path.

    ``batch_loss(batch, step)`` maps one micro-batch of optimizer step ``step`` (0-based) to its mean
    loss (the trainer's only own part; the step keys the samples' random draws). Each
    optimizer step accumulates ``grad_accum_steps`` micro-batches of ``state.batches``, steps,
    advances the LR schedule and updates the EMA (its decay warmed up where ``ema.warmup`` resolves
    on, ``opendit_lite.ema.decay``, keyed by the step count, so a resumed run continues it). Losses
    stay on ``device`` and are averaged over ranks only every ``log_every`` steps (the one host
    sync); checkpoints (``save_train_state``) every
    ``ckpt_every`` steps and at the end record the data position so a resumed run continues with the
    next batch. A non-finite loss stops the run before any later checkpoint (``guard.py``). A first
    Ctrl-C or SIGTERM stops the run at a step boundary with a checkpoint and raises
    ``RunInterrupted`` (see ``stop.py``). ``after_save(step, path)`` runs on every rank after each
    checkpoint (e.g. ``eval_every``). ``state.flops_per_step`` is counted by the run's first step
    when unknown (a resumed run has the saved count: counting runs the step under a dispatch mode,
    which may change its rounding, so only the first step of a run is ever counted)."""
    model, optimizer = state.model, state.optimizer
    guard = NonFiniteGuard(device, cfg.nan_policy)
    warmup = ema_warmup_on(cfg.ema.warmup, cfg.lora.rank)  # the decay of the update after s steps: ema_decay(.., s, ..)

    def save() -> str:
        guard.check_before_save(state.step, model)
        path = save_train_state(state, cfg, booster)
        log.write(f"saved checkpoint {path}")
        if after_save is not None:
            after_save(state.step, path)
        return path

    def micro_step(last: bool) -> torch.Tensor:
        # Gradients are reduced once, with the last micro-batch, where the strategy can defer it.
        defer = not last and booster.plugin.support_no_sync()
        with booster.no_sync(model, optimizer) if defer else contextlib.nullcontext():
            loss = batch_loss(next(state.batches), state.step)
            booster.backward(loss / cfg.grad_accum_steps, optimizer)
        return loss.detach()

    world_size = dist.get_world_size()
    loss_sum = torch.zeros((), device=device)
    since_log = 0
    peak_tflops = current_device_peak_tflops(device)
    log.start(state.step, cfg.max_steps)
    model.train()
    stopped = False
    stepped = False  # whether this process has run a step (a compiled run's first one measures the kernels)
    try:  # the progress bar and metrics files are closed whichever way the run ends
        with StopRequest() as stop:  # Ctrl-C / SIGTERM: stop at the next agreed step boundary, after saving
            while state.step < cfg.max_steps:
                step_loss = torch.zeros((), device=device)
                # A compiled run's first step in this process runs eagerly on CUDA: it times the fused kernels
                # against torch.compile before the graphs are built (kernels/kernel_choice.py).
                with first_step_context(cfg.compile and not stepped, device):
                    for i in range(cfg.grad_accum_steps):
                        last = i == cfg.grad_accum_steps - 1
                        if state.flops_per_step is None and state.step == 0 and not cfg.compile:  # not inside compile
                            loss, flops = counted_flops(lambda: micro_step(last))
                            state.flops_per_step = flops * cfg.grad_accum_steps
                        else:
                            loss = micro_step(last)
                        step_loss += loss / cfg.grad_accum_steps
                stepped = True
                if guard.policy == "skip_step" and guard.should_skip(state.step + 1, step_loss):
                    optimizer.zero_grad()
                    log.write(f"non-finite loss: skipped the update of step {state.step + 1} ({guard.skipped} so far)")
                    continue
                guard.observe(state.step + 1, step_loss)
                loss_sum += step_loss
                optimizer.step()
                optimizer.zero_grad()
                last_lr = state.lr_scheduler.get_last_lr()[0]  # the LR this step used
                state.lr_scheduler.step()
                if state.ema is not None:
                    update_sharded_ema(state.ema, optimizer, ema_decay(cfg.ema.decay, state.step, warmup),
                                       next_decay=ema_decay(cfg.ema.decay, state.step + 1, warmup))
                state.step += 1
                since_log += 1
                log.advance()
                if state.step % cfg.log_every == 0 or state.step == cfg.max_steps:
                    # one all-reduce for the loss, the stop votes and the non-finite flags
                    stats = torch.stack([loss_sum, stop.flag_like(loss_sum), guard.flag_like(loss_sum)])
                    dist.all_reduce(stats)
                    guard.raise_if_flagged(stats[2].item())
                    grad_norm = optimizer.get_grad_norm()  # the last step's, before clipping (None: not tracked)
                    log.log(state.step, {"loss": stats[0] / world_size}, since_log, cfg.global_batch_size,
                            extra={"lr": last_lr, "grad_norm": None if grad_norm is None else float(grad_norm),
                                   "mem_gib": peak_memory_gib(device), "epoch": state.batches.epoch},
                            flops_per_step=state.flops_per_step, peak_tflops=peak_tflops)
                    loss_sum.zero_()
                    since_log = 0
                    stopped = state.step < cfg.max_steps and stats[1].item() > 0  # some rank got a stop signal
                elif state.step < cfg.max_steps:
                    stopped = stop.agreed(state.step, loss_sum)
                if stopped:
                    stop.honour()
                    log.write(f"stop requested: saving at step {state.step}; continue with auto_resume=true")
                    break
                if cfg.ckpt_every and state.step % cfg.ckpt_every == 0 and state.step < cfg.max_steps:
                    save()
            path = save()  # still under the handlers: a repeat of the stop signal does not cut this save short
    finally:
        log.close()
    if stopped:
        raise RunInterrupted(f"a stop signal was honoured at step {state.step} of {cfg.max_steps}; the checkpoint "
                             f"{path} holds everything: rerun the same command with auto_resume=true to continue.")
    return path
