"""A config's clip and image shapes in latent units and tokens, for the planner and for ``sp_mode: auto``:
the buckets (or the one clip/image shape) a run trains on, and the sequence-parallel workload of its
largest bucket (``opendit_lite.parallel.AutoInputs``), so that the run's automatic SP mode and the
planner's come from the same numbers."""

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch.nn as nn

from ..data.latents import META as LATENT_META
from ..parallel import AutoInputs, Links, sp_workload
from .family import config_family

# Latent downsampling assumed when the config names a VAE (or precomputed latents) without loading it.
SD_VAE_DOWNSAMPLE = 8


@dataclass(frozen=True)
class LatentBucket:
    """A bucket as the model sees it: latent frames/height/width."""

    name: str
    frames: int
    height: int
    width: int
    extra_tokens: int = 0    # tokens a sample adds on the sequence axis beyond its latents' (an edit's reference)


def config_downsample(cfg) -> int:
    """Pixels per latent row of the config's data: 1 for pixels, else its family's stored latents'
    (``FamilyEncoders.pixels_per_latent``), else an SD-style VAE's 8."""
    if not (cfg.vae.path or cfg.data.type == "latents"):
        return 1
    from ..families import family_of

    family = family_of(cfg.model.name)
    return family.encoding.pixels_per_latent if family is not None else SD_VAE_DOWNSAMPLE


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


def latent_buckets(cfg, buckets=None, downsample: Optional[int] = None) -> List[LatentBucket]:
    """The config's buckets (or its one clip/image shape) in latent units."""
    if getattr(cfg.model, "pipeline", None):  # the pipeline's own VAE: its frame and pixel ratios
        from .pipeline import latent_clip_shape
        from .video import video_buckets

        buckets = buckets or video_buckets(dataclasses.replace(cfg, bucket_batch="auto")) or []
        shapes = [(b.name, b.shape) for b in buckets] or [
            (f"{cfg.data.num_frames}x{cfg.data.image_size}x{cfg.data.image_size}",
             (cfg.data.num_frames, cfg.data.image_size, cfg.data.image_size))]
        return [LatentBucket(name, *latent_clip_shape(cfg, *shape)[1:]) for name, shape in shapes]
    down = downsample or config_downsample(cfg)
    if config_family(cfg) == "video":
        if buckets is None and cfg.data.buckets:
            from .video import video_buckets

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


def token_grid(patch: Tuple[int, int, int], bucket: LatentBucket) -> Tuple[int, int]:
    """(frames, tokens per frame) of a bucket after patching (frames rounded up, as the embedders pad)."""
    pt, ph, pw = patch
    return -(-bucket.frames // pt), (bucket.height // ph) * (bucket.width // pw)


def config_patch_size(cfg, model: nn.Module) -> Optional[Tuple[int, int, int]]:
    """(pt, ph, pw) of the model's tokens (an image model's square patch as (1, p, p)); None for a model
    that does not say (one of the user's own, through LiteGen)."""
    if config_family(cfg) == "video":
        from .video import model_patch_size

        return tuple(model_patch_size(cfg, model))
    p = getattr(model, "patch_size", None)
    if p is None:
        return None
    return tuple(p) if isinstance(p, (tuple, list)) else (1, p, p)


def sp_auto_inputs(model: nn.Module, cfg, sp_size: int, ranks_per_node: int) -> AutoInputs:
    """What ``sp_mode: auto`` decides from for ``model`` built from ``cfg``: the workload of the config's
    largest bucket, and whether ``sp_size`` ranks span nodes of ``ranks_per_node`` (SP groups are runs of
    consecutive ranks)."""
    links = Links(ranks_per_node=ranks_per_node)
    patch = config_patch_size(cfg, model)
    if patch is None:  # no token geometry: auto decides by the heads
        return AutoInputs(None, spans_nodes=sp_size > ranks_per_node, links=links)
    frames, frame_tokens = max((token_grid(patch, b) for b in latent_buckets(cfg)), key=lambda g: g[0] * g[1])
    text = cfg.text_encoder.max_length if config_family(cfg) == "video" else 0
    workload = sp_workload(model, frames, frame_tokens, text, name=cfg.model.name)
    # A model whose attention is adapted only at conversion (timm's) shows no width here: decide by the heads.
    return AutoInputs(workload if workload.hidden else None, spans_nodes=sp_size > ranks_per_node, links=links)


__all__ = ["LatentBucket", "SD_VAE_DOWNSAMPLE", "config_downsample", "config_patch_size", "latent_buckets",
           "latent_folder_size", "sp_auto_inputs", "token_grid"]
