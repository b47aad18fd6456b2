"""Config -> objects for train_video.py, sample_video.py and the planner: the clip dataset and its
buckets, the caption encoder, the per-frame VAE and the text-to-video model (its geometry resolved
from the data). The video trainer's own declarations are ``opendit_lite.training.video``.

Three data sources, one batch layout: every batch becomes ``(x [B, C, T, H, W], states [B, M,
Cy], mask [B, M])``. The moving-shapes default and precomputed latents carry their caption states;
CSV videos carry captions that the text encoder turns into states on the fly.
"""

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from ..data.buckets import Bucket, BucketBatchSampler, parse_buckets
from ..data.media_folders import MEDIA_DATA_TYPES
from ..data.video_csv import media_dataset
from ..data.video_latents import PIPELINE_FORMAT, VideoLatentDataset, video_latent_meta
from ..data.video_shapes import MovingShapesDataset, caption_states
from ..distributed.mesh import node_group
from ..encoders.video_vae import VideoVAE
from ..errors import ConfigError
from ..models import build_model
from .diffusers_model import build_diffusers_model, diffusers_config, family_adapter, is_family
from .family import check_model_family
from .image import with_bad_sample_skipping

# Width of the moving-shapes word vectors when model.caption_channels does not say (the tiny models').
SHAPES_CAPTION_WIDTH = 32


def video_buckets(cfg) -> Optional[List[Bucket]]:
    """The parsed ``data.buckets``, or None for one fixed clip shape."""
    if not cfg.data.buckets:
        return None
    if cfg.data.type == "latents" and not getattr(cfg.model, "pipeline", None):
        raise ConfigError("data.buckets needs each sample's own size and reads clips at the bucket's: use "
                          "data.type=shapes or csv (precomputed latents have one fixed size), or latents extracted "
                          "from a pipeline (model.pipeline), which record each clip's size.")
    try:
        buckets = parse_buckets(cfg.data.buckets)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.bucket_batch == "config" and any(b.batch_size is None for b in buckets):
        raise ConfigError("every entry of data.buckets needs a batch_size, or set bucket_batch=auto to let the "
                          "planner size them.")
    return buckets


def build_video_dataset(cfg, buckets: Optional[Sequence[Bucket]] = None):
    """The clip dataset; with ``buckets`` the generated shapes data draws its samples at the bucket shapes."""
    return with_bad_sample_skipping(lambda: _video_dataset(cfg, buckets), cfg)


def _video_dataset(cfg, buckets: Optional[Sequence[Bucket]] = None):
    d = cfg.data
    if d.type == "shapes":
        try:
            return MovingShapesDataset(num_samples=d.num_samples, num_frames=d.num_frames, image_size=d.image_size,
                                       max_tokens=cfg.text_encoder.max_length,
                                       caption_channels=cfg.model.caption_channels or SHAPES_CAPTION_WIDTH,
                                       seed=cfg.global_seed, shapes=[b.shape for b in buckets] if buckets else None)
        except ValueError as e:
            raise ConfigError(f"data.type=shapes: {e}.") from None
    if d.type in MEDIA_DATA_TYPES:
        return media_dataset(d.type, d.path, d.num_frames, d.frame_interval, d.image_size,
                             require_captions=d.require_captions)
    return VideoLatentDataset(d.path)


def check_latents_without_pipeline(path: str) -> None:
    """Latents extracted from a pipeline (``scripts/extract_latents.py --pipeline``) hold every input that
    pipeline feeds its transformer: only a run from that pipeline (``model.pipeline``) reads them."""
    try:
        meta = video_latent_meta(path)
    except ValueError as e:
        raise ConfigError(f"'data.path': {e}; extract the latents again.") from None
    if meta.get("format") == PIPELINE_FORMAT:
        raise ConfigError(f"the latents in {path!r} were extracted from the pipeline {meta.get('pipeline')!r} "
                          f"(scripts/extract_latents.py --pipeline) and hold what that pipeline feeds its transformer: "
                          f"train them with model.pipeline={meta.get('pipeline')} (and no model.path / model.config).")


class CaptionEncoder:
    """Prompts -> (states [B, M, width], bool mask [B, M]) for any ``text_encoder.kind``: the
    moving-shapes word vectors need no model, T5/CLIP wrap a loaded ``TextEncoder``."""

    def __init__(self, kind: str, max_length: int, width: int, text_encoder=None):
        self.kind, self.max_length, self.width, self.text_encoder = kind, max_length, width, text_encoder

    def encode(self, prompts: Sequence[str], device) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.text_encoder is not None:
            states, mask = self.text_encoder.encode(list(prompts))
            return states.float().to(device), mask.to(device)
        pairs = [caption_states(p, self.max_length, self.width) for p in prompts]
        return torch.stack([s for s, _ in pairs]).to(device), torch.stack([m for _, m in pairs]).to(device)


def load_caption_encoder(cfg, device) -> CaptionEncoder:
    t = cfg.text_encoder
    if t.kind == "shapes":
        return CaptionEncoder("shapes", t.max_length, cfg.model.caption_channels or SHAPES_CAPTION_WIDTH)
    if not t.path:
        raise ConfigError(f"'text_encoder.path' is required to encode captions with text_encoder.kind={t.kind!r}: "
                          f"point it at a local folder holding the model and its tokenizer (nothing is downloaded).")
    from ..encoders.text import load_text_encoder, shard_text_encoder

    try:
        encoder = load_text_encoder(t.kind, t.path, t.max_length, device=device)
    except (FileNotFoundError, OSError) as e:
        raise ConfigError(f"Cannot load the {t.kind} text encoder from 'text_encoder.path' {t.path!r}: {e}") from None
    if cfg.encoder.fsdp and dist.is_initialized():  # every rank encodes its own captions in step: the gathers line up
        shard_text_encoder(encoder, node_group() if cfg.encoder.group else None)
    return CaptionEncoder(t.kind, t.max_length, encoder.width, encoder)


def load_video_vae(cfg, device, sp_group=None) -> Optional[VideoVAE]:
    """The per-frame VAE when ``vae.path`` is set; under sequence parallelism the ranks of a group
    share the frames to encode (DP VAE)."""
    if not cfg.vae.path:
        return None
    from ..encoders import load_vae

    return VideoVAE(load_vae(cfg.vae.path, device=device), scale_factor=cfg.vae.scale_factor, sp_group=sp_group)


def resolve_video_geometry(cfg, dataset, vae: Optional[VideoVAE], caption_width: Optional[int],
                           buckets: Optional[Sequence[Bucket]] = None) -> None:
    """Fill the model's ``in_channels``/``num_frames``/``input_size``/``caption_channels`` left as None,
    in place, so the config saved with a checkpoint alone rebuilds the model (sample_video.py relies on it).
    With buckets the recorded clip shape is the first bucket's (the models take any shape)."""
    m = cfg.model
    if buckets:
        first, down = buckets[0], (vae.downsample if vae is not None else 1)
        cfg.data.num_frames, cfg.data.image_size = first.frames, first.height
        m.input_size = m.input_size or [first.height // down, first.width // down]
    if cfg.data.type == "latents":  # precomputed clips describe themselves
        latents, states, _, _ = dataset[0]
        channels, frames, size = latents.shape[0], latents.shape[1], list(latents.shape[2:])
        caption_width = states.shape[-1]
        made_for = video_latent_meta(cfg.data.path).get("transformer")
        if made_for and made_for != m.name:
            raise ConfigError(f"The latents in {cfg.data.path!r} were extracted for {made_for} (with its VAE and text "
                              f"encoder), but model.name is {m.name}: extract them with --family for {m.name}, or "
                              f"train {made_for}.")
        if states.shape[0] != cfg.text_encoder.max_length:
            raise ConfigError(f"The latents in {cfg.data.path!r} hold {states.shape[0]} caption tokens per clip but "
                              f"text_encoder.max_length={cfg.text_encoder.max_length}; set it to {states.shape[0]}.")
    elif vae is not None:
        channels, frames, size = vae.latent_channels, cfg.data.num_frames, [cfg.data.image_size // vae.downsample] * 2
    else:
        channels, frames, size = 3, cfg.data.num_frames, [cfg.data.image_size] * 2
    caption_width = caption_width or getattr(dataset, "caption_channels", None)  # shapes: its word vectors
    # The models take clips of any frame count and size, but not another channel count or caption width.
    source = (f"the latents in {cfg.data.path!r}" if cfg.data.type == "latents" else
              "the VAE's latents" if vae is not None else "the clips in pixel space (no vae.path)")
    if m.in_channels is not None and m.in_channels != channels:
        raise ConfigError(f"model.in_channels={m.in_channels}, but {source} have {channels} channels: remove "
                          f"model.in_channels to take it from the data, or set it to {channels}.")
    if (not is_family(m.name) and m.caption_channels is not None and caption_width is not None
            and m.caption_channels != caption_width):  # a family's: check_family_inputs
        raise ConfigError(f"model.caption_channels={m.caption_channels}, but the caption states are {caption_width} "
                          f"wide (text_encoder.kind={cfg.text_encoder.kind}): remove model.caption_channels to take "
                          f"it from the text encoder, or set it to {caption_width}.")
    m.in_channels = m.in_channels or channels
    m.num_frames = m.num_frames or frames
    m.input_size = m.input_size or size
    m.caption_channels = m.caption_channels or caption_width


def check_bucket_shapes(buckets: Sequence[Bucket], patch_size: Tuple[int, int, int], downsample: int) -> None:
    """Every bucket's latent clip must split into whole patches."""
    pt, ph, pw = patch_size
    for b in buckets:
        if b.frames % pt or b.height % (ph * downsample) or b.width % (pw * downsample):
            raise ConfigError(f"bucket {b.name} ({b.frames}x{b.height}x{b.width} pixels) does not split into "
                              f"{pt}x{ph * downsample}x{pw * downsample}-pixel patches (patch size {patch_size}, VAE "
                              f"downsampling {downsample}); change its size.")


def build_bucket_sampler(buckets: Sequence[Bucket], dataset, dp_rank: int, dp_size: int,
                         seed: int) -> BucketBatchSampler:
    """The data-parallel rank's bucket sampler over ``dataset.sample_shapes``; refuses an empty epoch."""
    sampler = BucketBatchSampler(buckets, dataset.sample_shapes, dp_rank=dp_rank, dp_size=dp_size, seed=seed)
    if len(sampler) == 0:
        raise ConfigError(f"No bucket holds one global batch (batch_size x {dp_size} data-parallel ranks) of "
                          f"samples:\n{sampler.describe()}\nLower the batch sizes or add data.")
    return sampler


def bucket_loss_weights(buckets: Sequence[Bucket]) -> Dict[Tuple[int, int, int], float]:
    """Pixel clip shape (T, H, W) -> loss weight of its bucket."""
    return {b.shape: b.loss_weight for b in buckets}


def model_clip_shape(cfg) -> Tuple[int, int, int, int]:
    """(C, T, H, W) of one model input clip."""
    m = cfg.model
    h, w = (m.input_size[0], m.input_size[0]) if len(m.input_size) == 1 else m.input_size
    return m.in_channels, m.num_frames, h, w


def sample_clip_shape(cfg, downsample: int = 1, patch_size: Tuple[int, int, int] = (1, 1, 1)
                      ) -> Tuple[int, int, int, int]:
    """(C, T, H, W) of the clips to sample: ``sample.num_frames/height/width`` (pixels) where set,
    else the trained clip's; a size that does not split into whole patches is a ConfigError."""
    C, T, H, W = model_clip_shape(cfg)
    s = cfg.sample
    T = s.num_frames or T
    H = s.height // downsample if s.height else H
    W = s.width // downsample if s.width else W
    pt, ph, pw = patch_size
    if (any(v % downsample for v in (s.height or 0, s.width or 0)) or min(T, H, W) < 1
            or T % pt or H % ph or W % pw):
        raise ConfigError(f"sample.num_frames/height/width ({s.num_frames}, {s.height}, {s.width}) must split into "
                          f"whole {pt}x{ph * downsample}x{pw * downsample}-pixel patches (frames x height x width).")
    return C, T, H, W


def model_patch_size(cfg, model: nn.Module) -> Tuple[int, int, int]:
    """(pt, ph, pw) of the model's tokens: a zoo model's ``patch_size``, a diffusers family's from its adapter."""
    if is_family(cfg.model.name):
        return family_adapter(cfg.model.name).patch_size(diffusers_config(cfg))
    return tuple(model.patch_size)


def build_video_model(cfg) -> nn.Module:
    """The registered video model ``model.name`` (an image model is refused, naming train.py), or a
    diffusers transformer of a registered family (``build_diffusers_model``)."""
    m = cfg.model
    if is_family(m.name):
        return build_diffusers_model(cfg)
    check_model_family(m.name, "video")
    return build_model(m.name, in_channels=m.in_channels, caption_channels=m.caption_channels,
                        model_max_length=cfg.text_encoder.max_length, class_dropout_prob=m.class_dropout_prob,
                        learn_sigma=m.learn_sigma)
