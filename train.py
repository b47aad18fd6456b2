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

from opendit_lite.utils.quiet import quiet_third_party_startup

quiet_third_party_startup()  # before colossalai is imported

from opendit_lite.config import exit_on_config_error, parse_cli, validate_world
from opendit_lite.converter import ModuleConverter
from opendit_lite.encoders import vae_encode
from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.distributed.launch import cleanup_distributed, init_distributed
from opendit_lite.training.factory import (
    build_dataset_from_config,
    build_model_from_config,
    build_training_objective,
    load_vae_from_config,
    objective_loss,
    resolve_model_geometry,
)
from opendit_lite.training.loop import (
    ResumableBatches,
    boost_training,
    build_booster,
    enable_ema,
    restore_training,
    run_steps,
    write_run_config,
)
from opendit_lite.training.metrics import MetricsLogger
from opendit_lite.checkpoint.layout import pick_resume_checkpoint
from opendit_lite.distributed.seed import seed_everything
from opendit_lite.checkpoint.weights import load_weights


def train(cfg, info) -> str:
    run_dir = os.path.join(cfg.results_dir, cfg.exp_name)
    log = MetricsLogger(run_dir, enabled=info.is_main)

    plugin, booster = build_booster(cfg, info)  # first: it builds the mesh the conversions need
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
    if cfg.selective_ratio < 1.0:
        log.write(str(apply_activation_checkpointing(model, cfg.selective_ratio, offload=cfg.ac_offload)))
    objective = build_training_objective(cfg)
    model.to(info.device)
    num_params = sum(p.numel() for p in model.parameters())
    log.write(f"model {cfg.model.name}: {num_params / 1e6:.2f}M parameters, input {cfg.model.input_size} "
              f"x {cfg.model.in_channels} ch, {cfg.model.num_classes} classes, {cfg.diffusion.objective}")

    model, optimizer, lr_scheduler, dataloader, micro_batch = boost_training(cfg, plugin, booster, model, dataset)
    # One random stream per data-parallel rank: the ranks of a sequence-parallel group must draw the
    # same noise, timesteps and label dropout for the sample they share.
    seed_everything(cfg.global_seed, plugin.dp_rank, plugin.dp_size)
    ema_plugin = enable_ema(cfg, plugin, model, optimizer)
    step, epoch, batch_in_epoch = restore_training(cfg, booster, plugin, ema_plugin, model, optimizer,
                                                   lr_scheduler, log)
    write_run_config(cfg, run_dir, info.is_main)
    batches = ResumableBatches(dataloader, micro_batch, epoch, batch_in_epoch)
    encode = vae is not None and cfg.data.type != "latents"

    def batch_loss(batch) -> torch.Tensor:
        x, y = (t.to(info.device, non_blocking=True) for t in batch)  # x [B, C, H, W], y [B]
        if encode:
            x = vae_encode(vae, x, cfg.vae.scale_factor)               # [B, C_latent, H/8, W/8]
        return objective_loss(objective, model, x, dict(y=y))

    return run_steps(cfg, info, log, booster, plugin, ema_plugin, model, optimizer, lr_scheduler, batches, step,
                     batch_loss)


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
