#!/usr/bin/env python
"""Train a diffusion transformer with opendit_lite.

One process (CPU, or one GPU):
    python train.py --config configs/demo.yaml
One node with 8 GPUs:
    torchrun --standalone --nproc_per_node 8 train.py --config configs/dit_xl2_256.yaml zero_degree=2
Several nodes (the same command on every node):
    torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint $HEAD_NODE:29500 \\
        train.py --config configs/dit_xl2_256.yaml zero_degree=2 group_zero=true

A released Flux or SD3 model from its diffusers pipeline folder (images as 1-frame clips, conditioned
as its pipeline conditions them; the same config trains with train_video.py):
    python train.py --config configs/flux_lora.yaml

Settings are ``key=value`` overrides of the YAML file (``python train.py --help`` lists every key).
Outputs go to ``<results_dir>/<exp_name>/``: config.yaml, metrics.jsonl, tensorboard/ and
checkpoints/<exp_name>_step<N>/ (resume with ``auto_resume=true`` or ``resume_from=<folder>``).

Batch arithmetic: samples per optimizer step = global_batch_size
    = per-rank micro-batch x grad_accum_steps x data-parallel ranks (world size / sp_size).
"""

from opendit_lite.utils.exit_codes import exit_at_once_on_stop_signals, heavy_imports, script_main

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

from opendit_lite.utils.quiet import quiet_third_party_startup  # noqa: E402

quiet_third_party_startup()  # before colossalai is imported

# The config package needs no torch: a config error ends in a fraction of a second, before the
# seconds of importing torch, timm and Colossal-AI that a valid config goes on to.
from opendit_lite.config import parse_cli, train_script_schema  # noqa: E402


@script_main
def main(argv) -> str:
    """Train as the command line says; returns the final checkpoint's path (exit code 2 on a config error)."""
    cfg = parse_cli(argv, __doc__, schema=train_script_schema)  # a Flux / SD3 pipeline: the video schema
    with heavy_imports():
        from opendit_lite.training.image import image_script_trainer
        from opendit_lite.training.trainer import train_from_config
    return train_from_config(image_script_trainer(cfg), cfg)


if __name__ == "__main__":
    main()
