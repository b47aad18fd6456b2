#!/usr/bin/env python
"""Sample videos from text prompts with classifier-free guidance (against the model's learned null
caption, or zero caption states for a diffusers family); writes one MP4 per prompt (an animated
GIF where MP4 encoding is unavailable) and a PNG
contact sheet with one row of frames per prompt, and prints their paths. The same seed gives the
same videos.

From the newest checkpoint of a run (EMA weights by default), prompts from the config:
    python sample_video.py --config configs/video_stdit_demo.yaml
At another clip shape than the trained one (frames and pixels; the models take any shape):
    python sample_video.py --config configs/video_buckets_demo.yaml sample.num_frames=1 sample.height=16 sample.width=24
On several processes (prompts split over the data-parallel ranks; sp_size=2 shards each clip's
tokens over 2 ranks with Ulysses, sp_mode=ring/usp, or DSP with sp_mode=dsp); the videos are the one-process videos:
    torchrun --standalone --nproc_per_node 4 sample_video.py --config configs/video_stdit_demo.yaml sp_size=2
Guidance's two branches on two groups of ranks (2 x sp_size ranks per group of prompts), and a step
cache (sample.cache.kind: pab, first_block, teacache or magcache; docs/sampling.md):
    torchrun --standalone --nproc_per_node 4 sample_video.py --config configs/video_stdit_demo.yaml sp_size=2 \
        sample.cfg_parallel=true sample.cache.kind=pab
Prompts on the command line or from a file (one a line):
    python sample_video.py --config configs/video_stdit_demo.yaml 'sample.prompts=["a red disc moving up"]'
    python sample_video.py --config configs/video_stdit_xl.yaml sample.prompt_file=prompts.txt \\
        text_encoder.path=/models/t5-v1_1-xxl vae.path=/models/sd-vae-ft-ema

A run trained from a diffusers pipeline folder (model.pipeline, the same config) samples through that
pipeline: its own text encoders, scheduler, VAE, default guidance and negative prompt, with the run's
LoRA loaded by its load_lora_weights (or its fine-tuned transformer); sp_size splits each clip's tokens
as above, and the samples are those of the pipeline called directly with the same generators:
    python sample_video.py --config configs/wan_lora.yaml 'sample.prompts=["a dog running"]'

The model, text-encoder kind and objective are those saved with the checkpoint; ``sample.*`` (and
local paths such as ``vae.path``/``text_encoder.path``) come from this command.
"""

import os
from typing import List

from opendit_lite.utils.exit_codes import exit_at_once_on_stop_signals, heavy_imports, script_main

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

from opendit_lite.utils.quiet import quiet_third_party_startup  # noqa: E402

quiet_third_party_startup()  # before colossalai is imported

# No torch below: a config error ends before the seconds of importing torch, timm and Colossal-AI.
from opendit_lite.config import parse_cli  # noqa: E402
from opendit_lite.config.paths import check_output_path  # noqa: E402
from opendit_lite.config.video_schema import VideoTrainConfig  # noqa: E402


@script_main
def main(argv) -> List[str]:
    cfg = parse_cli(argv, __doc__, schema=VideoTrainConfig)
    # where the result goes (by default under the run folder), checked before minutes of sampling
    check_output_path(cfg.sample.output_dir or os.path.join(cfg.results_dir, cfg.exp_name),
                      "sample.output_dir" if cfg.sample.output_dir else "results_dir", folder=True)
    with heavy_imports():
        from opendit_lite.sampling.video import sample_prompts
        from opendit_lite.training.video import validate_video_config
    validate_video_config(cfg)
    return sample_prompts(cfg)


if __name__ == "__main__":
    main()
