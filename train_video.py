#!/usr/bin/env python
"""Train a text-to-video diffusion transformer (STDiT, Vchitect-style) with opendit_lite.

The embedded default (moving coloured shapes with captions, pixel space, CPU in minutes):
    python train_video.py --config configs/video_stdit_demo.yaml
    python train_video.py --config configs/video_vchitect_demo.yaml
Sequence parallelism over 2 ranks (Ulysses; sp_mode=dsp for STDiT's DSP):
    torchrun --standalone --nproc_per_node 2 train_video.py --config configs/video_stdit_demo.yaml sp_size=2
STDiT-XL/2 on 16x256x256 clips from precomputed latents, one node of 8 GPUs:
    torchrun --standalone --nproc_per_node 8 train_video.py --config configs/video_stdit_xl.yaml \\
        data.path=/data/latents text_encoder.path=/models/t5-v1_1-xxl vae.path=/models/sd-vae-ft-ema
CSV videos (path,text columns) encoded on the fly by a local VAE and T5:
    python train_video.py --config configs/video_stdit_demo.yaml data.type=csv data.path=/data/videos.csv \\
        text_encoder.kind=t5 text_encoder.path=/models/t5 text_encoder.max_length=120 vae.path=/models/sd-vae

Objectives: rectified flow (``diffusion.objective=rflow``, default) or IDDPM (``iddpm``, with
``model.learn_sigma=true`` for the learned variance). Captions are replaced by the model's learned
null caption with probability ``model.class_dropout_prob``, which classifier-free guidance needs.
Settings are ``key=value`` overrides (``python train_video.py --help`` lists every key). Outputs go to
``<results_dir>/<exp_name>/`` as with train.py; resume with ``auto_resume=true`` or ``resume_from=<folder>``.

Batch arithmetic: clips per optimizer step = global_batch_size
    = per-rank micro-batch x grad_accum_steps x data-parallel ranks (world size / sp_size);
the sp_size ranks of a group share each clip, each holding 1/sp_size of its tokens.
"""

import os
import sys

import torch

from opendit_lite.utils.quiet import quiet_third_party_startup

quiet_third_party_startup()  # before colossalai is imported

from opendit_lite.config import exit_on_config_error, parse_cli, validate_world
from opendit_lite.config.video_schema import VideoTrainConfig
from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.distributed.launch import cleanup_distributed, init_distributed
from opendit_lite.training.factory import build_training_objective, objective_loss
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
from opendit_lite.training.video import (
    apply_video_parallelism,
    batch_to_inputs,
    build_video_dataset,
    build_video_model,
    load_caption_encoder,
    load_video_vae,
    model_clip_shape,
    resolve_video_geometry,
    validate_video_config,
)
from opendit_lite.checkpoint.weights import load_weights


def train(cfg, info) -> str:
    run_dir = os.path.join(cfg.results_dir, cfg.exp_name)
    log = MetricsLogger(run_dir, enabled=info.is_main)

    plugin, booster = build_booster(cfg, info)
    seed_everything(cfg.global_seed, 0, 1)  # the same model initialisation on every rank

    dataset = build_video_dataset(cfg)
    # CSV captions are encoded while training; shapes and latents carry their states.
    captions = load_caption_encoder(cfg, info.device) if cfg.data.type == "csv" else None
    vae = load_video_vae(cfg, info.device, sp_group=plugin.sp_group) if cfg.data.type != "latents" else None
    resolve_video_geometry(cfg, dataset, vae, captions.width if captions else None)
    model = build_video_model(cfg)
    if cfg.init_from and not pick_resume_checkpoint(cfg):
        load_weights(model, cfg.init_from, use_ema=False)
        log.write(f"initialised weights from {cfg.init_from}")
    # Order: kernel/SP conversions replace modules, then checkpointing wraps the blocks holding
    # them, then the plugin wraps the whole model for DDP/ZeRO.
    log.write(apply_video_parallelism(model, cfg, plugin.sp_group))
    if cfg.selective_ratio < 1.0:  # validation rejects ac_offload without checkpointed blocks
        log.write(str(apply_activation_checkpointing(model, cfg.selective_ratio, offload=cfg.ac_offload)))
    objective = build_training_objective(cfg)
    model.to(info.device)
    num_params = sum(p.numel() for p in model.parameters())
    C, T, H, W = model_clip_shape(cfg)
    log.write(f"model {cfg.model.name}: {num_params / 1e6:.2f}M parameters, clips {C}x{T}x{H}x{W}, "
              f"captions {cfg.text_encoder.max_length}x{cfg.model.caption_channels}, {cfg.diffusion.objective}")

    model, optimizer, lr_scheduler, dataloader, micro_batch = boost_training(cfg, plugin, booster, model, dataset)
    # One random stream per data-parallel rank: the ranks of a sequence-parallel group must draw the
    # same noise, timesteps and caption dropout for the clip they share.
    seed_everything(cfg.global_seed, plugin.dp_rank, plugin.dp_size)
    ema_plugin = enable_ema(cfg, plugin, model, optimizer)
    step, epoch, batch_in_epoch = restore_training(cfg, booster, plugin, ema_plugin, model, optimizer,
                                                   lr_scheduler, log)
    write_run_config(cfg, run_dir, info.is_main)
    batches = ResumableBatches(dataloader, micro_batch, epoch, batch_in_epoch)

    def batch_loss(batch) -> torch.Tensor:
        x, states, mask = batch_to_inputs(batch, captions, vae, info.device)  # x [B, C, T, H, W]
        return objective_loss(objective, model, x, dict(y=states, mask=mask))

    return run_steps(cfg, info, log, booster, plugin, ema_plugin, model, optimizer, lr_scheduler, batches, step,
                     batch_loss)


@exit_on_config_error
def main(argv=None) -> None:
    cfg = parse_cli(sys.argv[1:] if argv is None else argv, __doc__, schema=VideoTrainConfig)
    validate_video_config(cfg)
    info = init_distributed()
    try:
        validate_world(cfg, info.world_size)
        train(cfg, info)
    finally:
        cleanup_distributed()


if __name__ == "__main__":
    main()
