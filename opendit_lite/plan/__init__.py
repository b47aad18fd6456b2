"""Memory planning: how large a batch each bucket can take on a device of a given size, and which
zero_degree / sp_size / selective_ratio / offload the run needs. ``python -m opendit_lite.plan``
prints a plan for a config; ``bucket_batch: auto`` in a video config sizes its buckets with it.

This module turns configs into the planner's inputs (a model shape read from a model built on the
meta device, the buckets in latent units, the bytes of an activation element from the resolved
precision); the memory arithmetic is in ``memory_model.py`` and the choice in ``planner.py``.
"""

import copy
import dataclasses
import json
import os
from typing import List, Optional, Sequence, Tuple

import torch

from ..build.family import config_family
from ..config import ConfigError
from ..data.latents import META as LATENT_META
from ..precision import Precision, resolve_precision
from .memory_model import ModelShape
from .planner import LatentBucket, Plan, Setting, plan

# Latent downsampling assumed when the config names a VAE (or precomputed latents) without loading it.
SD_VAE_DOWNSAMPLE = 8
CAPTION_WIDTHS = {"shapes": 32, "t5": 4096, "clip": 768}


def config_downsample(cfg) -> int:
    return SD_VAE_DOWNSAMPLE if (cfg.vae.path or cfg.data.type == "latents") else 1


def model_shape_of_config(cfg) -> ModelShape:
    """Build the config's model on the meta device (no memory, no weights) and read its shape."""
    cfg = copy.deepcopy(cfg)
    latent = config_downsample(cfg) > 1
    m = cfg.model
    m.in_channels = m.in_channels or (4 if latent else 3)
    with torch.device("meta"):
        if config_family(cfg) == "video":
            from ..build.video import build_video_model

            m.caption_channels = m.caption_channels or CAPTION_WIDTHS[cfg.text_encoder.kind]
            model = build_video_model(cfg)
        else:
            from ..build.image import build_model_from_config

            size = cfg.data.image_size // config_downsample(cfg)
            m.input_size = m.input_size or [size, size]
            m.num_classes = m.num_classes or 1000
            model = build_model_from_config(cfg)
    return ModelShape.of(model, m.name)


def latent_buckets(cfg, buckets=None, downsample: Optional[int] = None) -> List[LatentBucket]:
    """The config's buckets (or its one clip/image shape) in latent units."""
    down = downsample or config_downsample(cfg)
    if config_family(cfg) == "video":
        if buckets is None and cfg.data.buckets:
            from ..build.video import video_buckets

            buckets = video_buckets(dataclasses.replace(cfg, bucket_batch="auto"))
        if buckets:
            return [LatentBucket(b.name, b.frames, b.height // down, b.width // down) for b in buckets]
        size = cfg.data.image_size // down
        return [LatentBucket(f"{cfg.data.num_frames}x{cfg.data.image_size}x{cfg.data.image_size}",
                             cfg.data.num_frames, size, size)]
    if cfg.model.input_size:
        h, w = (cfg.model.input_size * 2)[:2]
    else:
        h, w = latent_folder_size(cfg) or [cfg.data.image_size // down] * 2
    return [LatentBucket(f"image {h * down}x{w * down}", 1, h, w)]


def latent_folder_size(cfg) -> Optional[Tuple[int, int]]:
    """(height, width) from the ``meta.json`` of an image latents folder, None when there is none to read
    (the planner then takes ``data.image_size`` / 8)."""
    if cfg.data.type != "latents" or not cfg.data.path:
        return None
    try:
        with open(os.path.join(cfg.data.path, LATENT_META), encoding="utf-8") as f:
            meta = json.load(f)
        return int(meta["height"]), int(meta["width"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def plan_precision(cfg) -> Precision:
    """The precision a plan assumes without a run: the config's, resolved for a CUDA device (the
    planner sizes GPUs: ``auto`` is bf16 there)."""
    return resolve_precision(cfg.precision, "cuda")


def plan_config(cfg, memory_gib: float, world_size: int, max_batch: int = 256, min_batch: int = 1,
                reserve_gib: float = 1.0, fixed: bool = False,
                precision: Optional[Precision] = None) -> Tuple[Plan, List[LatentBucket], ModelShape]:
    """Plan a config. ``fixed``: keep the config's zero_degree/sp_size/selective_ratio/ac_offload and only
    size the buckets (what ``bucket_batch: auto`` does inside a run whose settings are already chosen).
    ``precision``: the run's resolved precision (None: ``plan_precision(cfg)``)."""
    precision = precision or plan_precision(cfg)
    shape = model_shape_of_config(cfg)
    buckets = latent_buckets(cfg)
    settings = [Setting(cfg.zero_degree, cfg.sp_size, cfg.selective_ratio, cfg.ac_offload)] if fixed else None
    caption = cfg.text_encoder.max_length if config_family(cfg) == "video" else 0
    try:
        result = plan(shape, buckets, memory_gib, world_size, element_bytes=precision.element_bytes,
                      caption_tokens=caption, reserve_gib=reserve_gib, min_batch=min_batch, max_batch=max_batch,
                      settings=settings)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if config_family(cfg) != "video" and not cfg.model.input_size and cfg.data.type == "latents" \
            and latent_folder_size(cfg) is None:
        result.assumptions.append(f"image latents of data.image_size / {config_downsample(cfg)} (no meta.json in "
                                  f"data.path to read their size from); model.input_size=[H,W] plans another size")
    return result, buckets, shape


def plan_bucket_batches(cfg, buckets: Sequence, world_size: int, precision: Precision, log=None) -> list:
    """``bucket_batch: auto``: the buckets with the planner's batch sizes for this run's settings, its
    resolved ``precision`` and ``plan_memory_gb`` (default: the GPU's memory); a bucket's own
    batch_size, if given, caps its batch."""
    memory = cfg.plan_memory_gb
    if memory is None:
        if not torch.cuda.is_available():
            raise ConfigError("bucket_batch=auto needs plan_memory_gb (memory per device in GiB) when no GPU is "
                              "present.")
        memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2 ** 30
    result, _, shape = plan_config(cfg, memory, world_size, fixed=True, precision=precision)
    if log is not None:
        log.write("bucket_batch=auto:\n" + result.table(latent_buckets(cfg, buckets), shape))
    return [dataclasses.replace(b, batch_size=min(result.batches[b.name], b.batch_size or result.batches[b.name]))
            for b in buckets]


__all__ = ["LatentBucket", "ModelShape", "Plan", "Setting", "latent_buckets", "model_shape_of_config", "plan",
           "plan_bucket_batches", "plan_config", "plan_precision"]
