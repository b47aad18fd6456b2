"""The data of a run from a diffusers pipeline folder (``model.pipeline``), for the video trainer:
captioned images or clips from a CSV (``data.type: csv``), encoded while training by the pipeline's
own VAE and text encoders, or the same tensors extracted once (``data.type: latents``, written by
``scripts/extract_latents.py --pipeline``). Either way a batch becomes ``(latents [B, C, T, h, w],
{transformer keyword: text input [B, ...]})``, the denoiser feeds the transformer what the pipeline
feeds it (``builders.pipeline.pipeline_denoiser``), and each batch is trained with the shift the
pipeline's scheduler samples its latent shape with (Flux's and LTX-Video's depends on the token count:
one per bucket).
"""

import sys
from typing import Dict, Tuple

from ..builders.image import with_bad_sample_skipping
from ..builders.objective import objective_for
from ..builders.pipeline import (
    PipelineEncoders,
    latent_clip_shape,
    pipeline_csv_dataset,
    pipeline_denoiser,
    pipeline_recipe,
    run_pipeline_folder,
)
from ..builders.pipeline_experts import expert_objective_range
from ..builders.video import bucket_loss_weights, video_buckets
from ..data.buckets import assign_bucket
from ..data.latent_shards import LatentShards, check_shards, is_sharded
from ..data.media_folders import MEDIA_DATA_TYPES
from ..data.video_csv import collate_conditioned
from ..data.video_latents import PipelineLatentDataset, collate_pipeline_latents, load_null_text, video_latent_meta
from ..distributed.ranks import global_rank
from ..errors import ConfigError
from ..precision import resolve_precision
from .spec import TrainingData


def _latent_dataset(cfg):
    meta = video_latent_meta(cfg.data.path)
    try:
        if is_sharded(meta):
            check_shards(cfg.data.path)
            return LatentShards(cfg.data.path, meta)
        dataset = PipelineLatentDataset(cfg.data.path, meta.get("files", {}))
    except ValueError as e:
        raise ConfigError(f"'data.path': {e}.") from None
    if global_rank() == 0:
        print(f"note: {cfg.data.path} holds one .pt file per clip; shards read faster and stream from object "
              f"stores: python scripts/extract_latents.py --convert {cfg.data.path} --output <new folder>",
              file=sys.stderr)
    return dataset


def _check_latent_buckets(dataset: PipelineLatentDataset, buckets) -> None:
    """Every latent clip of a bucketed run trains in the bucket of its own size (latents cannot be resized)."""
    shapes = {b.shape for b in buckets}
    for size in sorted(set(dataset.sample_shapes)):
        if size in shapes:
            continue
        j = assign_bucket(buckets, size)
        if j is not None:
            raise ConfigError(f"latent clips of {'x'.join(map(str, size))} pixels would train in bucket "
                              f"{buckets[j].name}, of another size; latents are not resized: add a bucket of "
                              f"exactly their size to data.buckets.")


def prepare_pipeline_data(cfg, device, sp_group=None) -> TrainingData:
    folder = run_pipeline_folder(cfg)
    family, m, d = folder.family, cfg.model, cfg.data
    config = folder.transformer_config()
    buckets = video_buckets(cfg)
    m.caption_channels = family.adapter.text_width(config)
    conditioned = folder.conditioning.image_input != "none"
    collate = (collate_conditioned if d.type in MEDIA_DATA_TYPES else collate_pipeline_latents) if conditioned else None
    if d.type in MEDIA_DATA_TYPES:  # a CSV or media folders, encoded while training
        dataset = with_bad_sample_skipping(lambda: pipeline_csv_dataset(cfg, folder), cfg)
        precision = resolve_precision(cfg.precision, device.type)
        text_dtype = precision.autocast_dtype or precision.param_dtype  # the encoders in the run's compute dtype
        encoders = PipelineEncoders(folder, device, text_dtype=text_dtype)
        null_text = encoders.null_text()

        def model_inputs(batch):
            clips, captions, *images = batch                 # [B, 3, T, H, W], B captions, per sample its images
            return encoders.encode(clips, captions, *images)  # latents [B, C, T', h, w], text (and image) inputs

        def pixel_shape(batch):
            return tuple(batch[0].shape[2:])                               # (T, H, W) of the clips
    else:
        dataset = _latent_dataset(cfg)
        if buckets:
            _check_latent_buckets(dataset, buckets)
        null_text = load_null_text(d.path)

        def model_inputs(batch):
            latents, text, _ = batch                                        # [B, C, T, h, w], {key: [B, ...]}
            return (latents.to(device, non_blocking=True),
                    {k: v.to(device, non_blocking=True) for k, v in text.items()})
    # The model geometry the config records: the first bucket's (or the one clip size's) latents.
    if buckets:
        frames, height, width = buckets[0].shape
    elif d.type == "latents":  # their one recorded size (rectangular ones included)
        frames, height, width = video_latent_meta(d.path)["pixel_sizes"][0]
    else:
        frames, height, width = d.num_frames, d.image_size, d.image_size
    C, T, h, w = latent_clip_shape(cfg, frames, height, width)
    m.in_channels, m.num_frames, m.input_size = C, T, [h, w]
    diffusion = cfg.diffusion
    recipe = pipeline_recipe(cfg, (1, C, T, h, w))
    diffusion.objective = diffusion.objective or recipe.objective
    diffusion.timestep_sampling = diffusion.timestep_sampling or recipe.timestep_sampling
    per_shape = diffusion.shift is None  # the pipeline's shift for each latent shape (a bucket's token count)
    if per_shape and not buckets:
        diffusion.shift = recipe.shift
    objectives: Dict[Tuple[int, ...], object] = {}
    time_range = expert_objective_range(cfg)  # one expert of Wan 2.2's pair: its own noise range

    def objective(x_shape):
        key = tuple(x_shape[1:])
        if key not in objectives:
            shift = pipeline_recipe(cfg, x_shape).shift if per_shape else diffusion.shift
            objectives[key] = objective_for(diffusion.objective, diffusion.timestep_sampling, shift,
                                            diffusion.diffusion_steps, time_range=time_range)
        return objectives[key]

    def denoiser(model, call):
        return pipeline_denoiser(cfg, model, null_text, call)

    if not buckets:
        return TrainingData(dataset, model_inputs, objective=objective, denoiser=denoiser, collate=collate)

    def batch_sampler(model, dp_rank: int, dp_size: int, world_size: int, log, precision):
        from .video import sized_bucket_sampler  # the sizes were checked against the pipeline already

        return sized_bucket_sampler(cfg, buckets, dataset, dp_rank, dp_size, world_size, log, precision)

    weights = bucket_loss_weights(buckets)

    def loss_weight(batch):  # a batch holds one bucket, of one pixel shape
        return weights[pixel_shape(batch) if d.type in MEDIA_DATA_TYPES else _latent_pixel_shape(batch, cfg)]

    return TrainingData(dataset, model_inputs, batch_sampler=batch_sampler, loss_weight=loss_weight,
                        objective=objective, denoiser=denoiser, collate=collate)


def _latent_pixel_shape(batch, cfg) -> Tuple[int, int, int]:
    """The pixel size (frames, height, width) of a batch of latents, from the buckets whose latents have
    its shape."""
    latents = batch[0]
    for bucket in video_buckets(cfg):
        if tuple(latent_clip_shape(cfg, *bucket.shape)[1:]) == tuple(latents.shape[2:]):
            return bucket.shape
    raise ConfigError(f"a batch of latents {tuple(latents.shape[1:])} matches no bucket of data.buckets.")
