#!/usr/bin/env python
"""Train a diffusion transformer with opendit_lite.

One process (CPU, or one GPU):
    python train.py --config configs/demo.yaml
One node with 8 GPUs:
    torchrun --standalone --nproc_per_node 8 train.py --config configs/dit_xl2_256.yaml zero_degree=2
Several nodes (the same command on every node):
    torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint $HEAD_NODE:29500 \\
        train.py --config configs/dit_xl2_256.yaml zero_degree=2 group_zero=true

Settings are ``key=value`` overrides of the YAML file (``python train.py --help`` lists every key).
Outputs go to ``<results_dir>/<exp_name>/``: config.yaml, metrics.jsonl, tensorboard/ and
checkpoints/<exp_name>_step<N>/ (resume with ``auto_resume=true`` or ``resume_from=<folder>``).

Batch arithmetic: samples per optimizer step = global_batch_size
    = per-rank micro-batch x grad_accum_steps x data-parallel ranks (world size / sp_size).
"""

import os
import sys

import torch
import torch.distributed as dist
import yaml

from opendit_lite.utils.quiet import quiet_third_party_startup

quiet_third_party_startup()  # before colossalai is imported

from colossalai.booster import Booster

from opendit_lite.config import ConfigError, exit_on_config_error, parse_cli, to_dict, validate_world
from opendit_lite.converter import ModuleConverter
from opendit_lite.data.sampler import ResumableDistributedSampler
from opendit_lite.memory import apply_activation_checkpointing
from opendit_lite.plugins import OpenDiTPlugin
from opendit_lite.plugins.checkpoint import find_latest_checkpoint, load_checkpoint, load_ema_file, save_checkpoint
from opendit_lite.training.distributed import cleanup_distributed, init_distributed
from opendit_lite.training.factory import (
    build_dataset_from_config,
    build_model_from_config,
    build_training_objective,
    diffusion_loss,
    load_vae_from_config,
    resolve_model_geometry,
)
from opendit_lite.training.lr_schedule import warmup_scheduler
from opendit_lite.training.metrics import MetricsLogger
from opendit_lite.training.seed import seed_everything
from opendit_lite.training.weights import load_weights
from opendit_lite.encoders import vae_encode


def checkpoint_root(cfg) -> str:
    return cfg.checkpoint_dir or os.path.join(cfg.results_dir, cfg.exp_name, "checkpoints")


def pick_resume_checkpoint(cfg):
    """LiteGen's priority: resume_from > auto_resume (newest complete checkpoint) > nothing."""
    if cfg.resume_from:
        return cfg.resume_from
    if cfg.auto_resume:
        return find_latest_checkpoint(checkpoint_root(cfg), cfg.exp_name)
    return None


def train(cfg, info) -> str:
    run_dir = os.path.join(cfg.results_dir, cfg.exp_name)
    log = MetricsLogger(run_dir, enabled=info.is_main)
    if cfg.allow_tf32 and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    # Plugin first: it builds the data x sequence mesh that the conversions need.
    try:
        plugin = OpenDiTPlugin(zero_degree=cfg.zero_degree, sp_size=cfg.sp_size, precision=cfg.precision,
                               grad_clip=cfg.grad_clip, group_zero=cfg.group_zero, node_size=info.local_world_size)
    except ValueError as e:  # a strategy this launch cannot run (e.g. Gemini without CUDA)
        raise ConfigError(str(e)) from None
    booster = Booster(plugin=plugin)
    seed_everything(cfg.global_seed, 0, 1)  # the same model initialisation on every rank

    dataset = build_dataset_from_config(cfg)
    vae = load_vae_from_config(cfg, info.device)
    resolve_model_geometry(cfg, dataset, vae)
    model = build_model_from_config(cfg)
    if cfg.init_from and not pick_resume_checkpoint(cfg):
        load_weights(model, cfg.init_from, use_ema=False)
        log.write(f"initialised weights from {cfg.init_from}")
    # Order: kernel/SP conversions replace modules, then checkpointing wraps the blocks holding
    # them, then the plugin wraps the whole model for DDP/ZeRO.
    log.write(str(ModuleConverter(cfg, sp_group=plugin.sp_group).convert(model)))
    if cfg.selective_ratio < 1.0 or cfg.ac_offload:
        log.write(str(apply_activation_checkpointing(model, cfg.selective_ratio, offload=cfg.ac_offload)))
    objective = build_training_objective(cfg)
    model.to(info.device)
    num_params = sum(p.numel() for p in model.parameters())
    log.write(f"model {cfg.model.name}: {num_params / 1e6:.2f}M parameters, input {cfg.model.input_size} "
              f"x {cfg.model.in_channels} ch, {cfg.model.num_classes} classes")

    micro_batch = cfg.global_batch_size // (plugin.dp_size * cfg.grad_accum_steps)
    optimizer = plugin.build_optimizer(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                       fused=cfg.fused_optimizer)
    lr_scheduler = warmup_scheduler(optimizer, cfg.warmup_steps)
    dataloader = plugin.prepare_dataloader(dataset, batch_size=micro_batch, shuffle=True, seed=cfg.global_seed,
                                           drop_last=True, num_workers=cfg.num_workers, pin_memory=cfg.pin_memory,
                                           distributed_sampler_cls=ResumableDistributedSampler)
    if len(dataloader) == 0:
        raise SystemExit(f"error: the dataset has {len(dataset)} samples, fewer than one batch of "
                         f"{micro_batch} per data-parallel rank; lower global_batch_size or add data.")
    model, optimizer, _, dataloader, lr_scheduler = booster.boost(model, optimizer, dataloader=dataloader,
                                                                  lr_scheduler=lr_scheduler)
    # One random stream per data-parallel rank: the ranks of a sequence-parallel group must draw the
    # same noise, timesteps and label dropout for the sample they share.
    seed_everything(cfg.global_seed, plugin.dp_rank, plugin.dp_size)
    ema_plugin = None
    if cfg.ema.enable:
        plugin.create_ema(model, optimizer)
        ema_plugin = plugin

    step, epoch, batch_in_epoch = 0, 0, 0
    resume = pick_resume_checkpoint(cfg)
    if resume:
        state = load_checkpoint(booster, resume, model, optimizer, lr_scheduler, plugin=ema_plugin)
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        log.write(f"resumed from {resume} at step {step}")
    if cfg.ema.enable and cfg.ema.resume_from:  # an explicit EMA file wins over the checkpoint's
        load_ema_file(plugin, cfg.ema.resume_from)
    if info.is_main:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
    log.start(step, cfg.max_steps)

    def save(at_step: int) -> str:
        extra = {"epoch": epoch, "batch_in_epoch": batch_in_epoch, "config": to_dict(cfg)}
        return save_checkpoint(booster, checkpoint_root(cfg), at_step, model, optimizer, lr_scheduler,
                               plugin=ema_plugin, extra_state=extra, keep_last=cfg.keep_last or None,
                               exp_name=cfg.exp_name)

    sums = {"loss": torch.zeros((), device=info.device)}
    since_log = 0
    model.train()
    data_iter = None
    last_ckpt = None
    while step < cfg.max_steps:
        if data_iter is None:
            dataloader.sampler.set_epoch(epoch)
            dataloader.sampler.set_start_index(batch_in_epoch * micro_batch)
            data_iter = iter(dataloader)
        for micro in range(cfg.grad_accum_steps):
            try:
                x, y = next(data_iter)
            except StopIteration:
                epoch, batch_in_epoch = epoch + 1, 0
                dataloader.sampler.set_epoch(epoch)
                dataloader.sampler.set_start_index(0)
                data_iter = iter(dataloader)
                x, y = next(data_iter)
            batch_in_epoch += 1
            x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
            if vae is not None and cfg.data.type != "latents":
                x = vae_encode(vae, x, cfg.vae.scale_factor)
            loss = diffusion_loss(objective, model, x, y)
            booster.backward(loss / cfg.grad_accum_steps, optimizer)
            sums["loss"] += loss.detach() / cfg.grad_accum_steps
        optimizer.step()
        optimizer.zero_grad()
        lr_scheduler.step()
        if ema_plugin is not None:
            plugin.update_ema(model, optimizer, decay=cfg.ema.decay)
        step += 1
        since_log += 1
        log.advance()

        if step % cfg.log_every == 0 or step == cfg.max_steps:
            dist.all_reduce(sums["loss"])
            sums["loss"] /= info.world_size
            log.log(step, sums, since_log, cfg.global_batch_size, extra={"lr": lr_scheduler.get_last_lr()[0],
                                                                         "epoch": epoch})
            sums["loss"].zero_()
            since_log = 0
        if cfg.ckpt_every and step % cfg.ckpt_every == 0 and step < cfg.max_steps:
            last_ckpt = save(step)
            log.write(f"saved checkpoint {last_ckpt}")

    last_ckpt = save(step)
    log.write(f"saved checkpoint {last_ckpt}")
    log.close()
    return last_ckpt


@exit_on_config_error
def main(argv=None) -> None:
    cfg = parse_cli(sys.argv[1:] if argv is None else argv, __doc__)
    info = init_distributed()
    try:
        validate_world(cfg, info.world_size)
        train(cfg, info)
    finally:
        cleanup_distributed()


if __name__ == "__main__":
    main()
