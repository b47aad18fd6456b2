#!/usr/bin/env python
"""Train a text-to-video diffusion transformer (STDiT, Vchitect-style, or a diffusers Wan,
HunyuanVideo, CogVideoX, LTX-Video, Flux or SD3 transformer) with opendit_lite.

The embedded default (moving coloured shapes with captions, pixel space, CPU in minutes):
    python train_video.py --config configs/video_stdit_demo.yaml
    python train_video.py --config configs/video_vchitect_demo.yaml
A tiny random-init diffusers WanTransformer3DModel on the same data (model.config; model.path loads a
local diffusers folder), with Wan's recipe (flow matching, shift 5):
    python train_video.py --config configs/wan_tiny_demo.yaml
A released model from its diffusers pipeline folder (Wan, HunyuanVideo, CogVideoX, LTX-Video, Flux,
SD3), conditioned as its pipeline conditions it, on your captioned clips or images
(docs/finetune_released_model.md):
    python train_video.py --config configs/wan_lora.yaml model.pipeline=/models/Wan2.1-T2V-1.3B-Diffusers \\
        data.path=/data/clips.csv
Sequence parallelism over 2 ranks (Ulysses; sp_mode=ring / usp / auto, or dsp for STDiT's DSP):
    torchrun --standalone --nproc_per_node 2 train_video.py --config configs/video_stdit_demo.yaml sp_size=2
STDiT-XL/2 on 16x256x256 clips from precomputed latents, one node of 8 GPUs:
    torchrun --standalone --nproc_per_node 8 train_video.py --config configs/video_stdit_xl.yaml \\
        data.path=/data/latents text_encoder.path=/models/t5-v1_1-xxl vae.path=/models/sd-vae-ft-ema
CSV videos (path,text columns) encoded on the fly by a local VAE and T5:
    python train_video.py --config configs/video_stdit_demo.yaml data.type=csv data.path=/data/videos.csv \\
        text_encoder.kind=t5 text_encoder.path=/models/t5 text_encoder.max_length=120 vae.path=/models/sd-vae

Objectives: rectified flow (``diffusion.objective=rflow``, the zoo's default) or IDDPM (``iddpm``, with
``model.learn_sigma=true`` for the learned variance); a diffusers family trains with its published
recipe (``opendit_lite.families``) unless ``diffusion.*`` says otherwise. Captions are replaced by the model's learned
null caption with probability ``model.class_dropout_prob``, which classifier-free guidance needs.
Settings are ``key=value`` overrides (``python train_video.py --help`` lists every key). Outputs go to
``<results_dir>/<exp_name>/`` as with train.py; resume with ``auto_resume=true`` or ``resume_from=<folder>``.

Batch arithmetic: clips per optimizer step = global_batch_size
    = per-rank micro-batch x grad_accum_steps x data-parallel ranks (world size / sp_size);
the sp_size ranks of a group share each clip, each holding 1/sp_size of its tokens.
"""

from opendit_lite.utils.exit_codes import exit_at_once_on_stop_signals, heavy_imports, script_main

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

from opendit_lite.utils.quiet import quiet_third_party_startup  # noqa: E402

quiet_third_party_startup()  # before colossalai is imported

# The config package needs no torch: a config error ends in a fraction of a second, before the
# seconds of importing torch, timm and Colossal-AI that a valid config goes on to.
from opendit_lite.config import parse_cli  # noqa: E402
from opendit_lite.config.video_schema import VideoTrainConfig  # noqa: E402


@script_main
def main(argv) -> str:
    """Train as the command line says; returns the final checkpoint's path (exit code 2 on a config error)."""
    cfg = parse_cli(argv, __doc__, schema=VideoTrainConfig)
    with heavy_imports():
        from opendit_lite.training.distill_pipeline import video_script_trainer
        from opendit_lite.training.trainer import train_from_config
        from opendit_lite.training.video import VIDEO_TRAINER
    return train_from_config(video_script_trainer(cfg, VIDEO_TRAINER), cfg)


if __name__ == "__main__":
    main()
