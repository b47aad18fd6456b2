#!/usr/bin/env python
"""Sample class-conditional images with classifier-free guidance and write a labelled PNG grid
(one row per class label). The same seed gives the same images.

From the newest checkpoint of a run (EMA weights by default):
    python sample.py --config configs/demo.yaml
On 8 GPUs (samples split over the ranks; sp_size=2 also shards each sample's tokens over 2 ranks);
the grid is the one-process grid, since sample i's noise depends only on (sample.seed, i):
    torchrun --standalone --nproc_per_node 8 sample.py --config configs/dit_xl2_256.yaml sp_size=2 sample.ckpt=...
Guidance's two branches on two groups of ranks (2 x sp_size ranks per group of samples), and a step
cache (sample.cache.kind: pab, first_block, teacache or magcache; docs/sampling.md):
    torchrun --standalone --nproc_per_node 2 sample.py --config configs/demo.yaml sample.cfg_parallel=true
    python sample.py --config configs/demo.yaml sample.cache.kind=teacache
From an original DiT checkpoint (weights and VAE from local paths; nothing is downloaded):
    python sample.py --config configs/dit_xl2_256.yaml sample.ckpt=/models/DiT-XL-2-256x256.pt \\
        vae.path=/models/sd-vae-ft-ema sample.class_labels=[207,360,387,974,88,979,417,279]

A run trained from a Flux or SD3 pipeline folder (model.pipeline; train.py's config) samples its prompts
through that pipeline, as sample_video.py does (one PNG per prompt and a contact sheet):
    python sample.py --config configs/flux_lora.yaml 'sample.prompts=["a black cat"]'

``python sample.py --help`` lists every key; the ``sample.*`` section is specific to this script.
"""

import os
from typing import List, Union

from opendit_lite.utils.exit_codes import exit_at_once_on_stop_signals, heavy_imports, script_main

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

from opendit_lite.utils.quiet import quiet_third_party_startup  # noqa: E402

quiet_third_party_startup()  # before colossalai is imported

# No torch below: a config error ends before the seconds of importing torch, timm and Colossal-AI.
from opendit_lite.config import ConfigError, parse_cli, train_script_schema  # noqa: E402
from opendit_lite.config.paths import check_output_path  # noqa: E402


def sample_pipeline(cfg) -> List[str]:
    """A run from the pipeline folder of an image family (``model.pipeline``: Flux, SD3), sampled through
    that pipeline (train.py trained it as train_video.py does, with the same config)."""
    check_output_path(cfg.sample.output_dir or os.path.join(cfg.results_dir, cfg.exp_name),
                      "sample.output_dir" if cfg.sample.output_dir else "results_dir", folder=True)
    with heavy_imports():
        from opendit_lite.builders.pipeline import pipeline_folder
        from opendit_lite.sampling.video import sample_prompts
        from opendit_lite.training.video import validate_video_config
    family = pipeline_folder(cfg.model.pipeline).family
    if not family.adapter.image_only:
        raise ConfigError(f"'model.pipeline' {cfg.model.pipeline!r} is a {family.pipeline}, a video model: sample it "
                          f"with sample_video.py (the same config); sample.py samples the image pipelines (Flux, SD3).")
    validate_video_config(cfg)
    return sample_prompts(cfg)


@script_main
def main(argv) -> Union[str, List[str]]:
    cfg = parse_cli(argv, __doc__, schema=train_script_schema)  # a Flux / SD3 pipeline run: the video schema
    if getattr(cfg.model, "pipeline", None):
        return sample_pipeline(cfg)
    # where the result goes (by default under the run folder), checked before minutes of sampling
    check_output_path(cfg.sample.output or os.path.join(cfg.results_dir, cfg.exp_name),
                      "sample.output" if cfg.sample.output else "results_dir", folder=not cfg.sample.output)
    with heavy_imports():
        import torch

        from opendit_lite.builders.image import build_dataset_from_config
        from opendit_lite.sampling import gather_on_main, sampling_ranks
        from opendit_lite.sampling.fast import fast_sampling
        from opendit_lite.sampling.image import class_labels, image_batches, load_image_model
        from opendit_lite.sampling.outputs import default_output, labelled_grid
    with sampling_ranks(cfg.sp_size, cfg.sample.cfg_parallel) as ranks:
        model, ckpt, vae, dataset = load_image_model(cfg, ranks)
        fast = fast_sampling(model, cfg, ranks)
        labels = cfg.sample.class_labels if cfg.sample.class_labels is not None else list(range(cfg.model.num_classes))
        per_sample = class_labels(cfg.model.num_classes, labels, cfg.sample.samples_per_class)  # rows x cols
        mine = [images for _, images in image_batches(model, cfg, per_sample, ranks, vae, step_progress=True,
                                                      fast=fast)]
        images = gather_on_main(torch.cat(mine) if mine else torch.empty(0), ranks)
        if not ranks.is_main:
            return ""
    if dataset is None and cfg.data.type == "shapes":
        dataset = build_dataset_from_config(cfg)
    classes = getattr(dataset, "classes", None)
    names = [classes[lab] if classes else f"class {lab}" for lab in labels]
    out = cfg.sample.output or default_output(os.path.join(cfg.results_dir, cfg.exp_name), ckpt, ".png")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    labelled_grid(images, len(labels), names).save(out)
    layout = f"{ranks.dp_size} data-parallel x {ranks.cfg_size} guidance-branch x {ranks.sp_size} sequence-parallel"
    print(f"wrote {len(per_sample)} samples ({len(labels)} classes x {cfg.sample.samples_per_class}) from {ckpt} "
          f"to {out} ({layout} ranks)")
    if fast.cache is not None:
        print(fast.cache.summary() + " on rank 0")
    return out


if __name__ == "__main__":
    main()
