"""Text-to-video sampling: the model, caption encoder and VAE for a checkpoint, the prompts, and
batches of clips for this rank's block of prompts (sample_video.py writes them as videos and a
contact sheet, ``sample_prompts``). The sampler and the checkpoint handling are those of every sampling run
(``sampler.py``, ``denoiser.py``); what is particular to videos is here: prompts and their caption
states, the clip shape (``sample.num_frames/height/width``), and guidance by the model's layout."""

import os
from typing import Iterator, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from ..builders.diffusers_model import family_denoiser, is_family
from ..builders.student_lora import is_pipeline_distillation
from ..builders.video import (
    CaptionEncoder,
    build_video_model,
    load_caption_encoder,
    load_video_vae,
    sample_clip_shape,
)
from ..checkpoint.layout import saved_config
from ..config import ConfigError
from ..diffusion.sampling_utils import SampleGenerators
from ..encoders.video_vae import VideoVAE
from ..families import FamilyDenoiser, family_of
from .denoiser import adopt_trained_sections, find_sample_checkpoint, load_denoiser
from .fast import PLAIN, FastSampling, fast_sampling
from .outputs import default_output, write_images, write_videos
from .pipeline_sampling import check_pipeline_sampling, check_student_sampling, load_trained_pipeline, pipeline_batches
from .sampler import check_sampler, denoise
from .sharding import SamplingRanks, gather_on_main, sampling_ranks

# Captions of the embedded moving-shapes data, used when no prompts are given for it.
SHAPES_PROMPTS = ["a red square moving right", "a blue disc moving down", "a green disc moving left",
                  "a yellow square moving up"]


def find_video_checkpoint(cfg) -> str:
    """The checkpoint to sample (``find_sample_checkpoint``), with the model, diffusion and
    text-encoder kind it was trained with adopted into ``cfg`` in place (a local
    ``text_encoder.path`` given here wins over the saved one); then the settings checks that need
    them (sampler, pixel space or a VAE)."""
    ckpt = find_sample_checkpoint(cfg, "video")
    saved = saved_config(ckpt)
    if "model" not in saved:
        raise ConfigError(f"{ckpt!r} carries no saved config (meta.json): sample_video.py reads checkpoints "
                          f"written by train_video.py.")
    path, pipeline = cfg.text_encoder.path, cfg.model.pipeline
    adopt_trained_sections(cfg, saved, ("model", "diffusion", "text_encoder"))
    if cfg.model.pipeline:  # sampled through its pipeline (sampling/pipeline_sampling.py)
        if is_pipeline_distillation(saved):
            check_student_sampling(cfg, saved)
        check_pipeline_sampling(cfg, pipeline, path)
        return ckpt
    if pipeline:
        raise ConfigError(f"{ckpt!r} was trained without model.pipeline (its model is {cfg.model.name}), so there is "
                          f"no pipeline of it to sample through: remove model.pipeline={pipeline} (it samples with "
                          f"its own sampler), or give sample.ckpt of a run trained from that pipeline.")
    if cfg.sample.images:
        raise ConfigError(f"sample.images gives conditioning images, but {cfg.model.name} was trained on captions "
                          f"alone (no image-conditioned pipeline) and would ignore them: remove sample.images.")
    cfg.text_encoder.path = path or cfg.text_encoder.path
    check_sampler(cfg)
    if not pixel_space(cfg) and not cfg.vae.path:
        raise ConfigError(f"The model works on {cfg.model.in_channels}-channel latents: set vae.path to the local "
                          f"VAE folder that decodes them.")
    return ckpt


def pixel_space(cfg) -> bool:
    """The model denoises RGB pixels (no VAE)."""
    return cfg.model.in_channels == 3 and not cfg.vae.path


def read_prompts(cfg) -> List[str]:
    """``sample.prompts``, else the lines of ``sample.prompt_file``, else (shapes captions) a few
    captions of the moving-shapes data."""
    s = cfg.sample
    if s.prompts:
        return list(s.prompts)
    if s.prompt_file:
        if not os.path.isfile(s.prompt_file):
            raise ConfigError(f"'sample.prompt_file' {s.prompt_file!r} does not exist.")
        try:
            with open(s.prompt_file, encoding="utf-8") as f:
                prompts = [line.strip() for line in f if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"'sample.prompt_file' {s.prompt_file!r} cannot be read as UTF-8 text ({e}): pass a "
                              f"text file with one prompt a line.") from None
        if not prompts:
            raise ConfigError(f"'sample.prompt_file' {s.prompt_file!r} holds no prompts (one per line).")
        return prompts
    if cfg.text_encoder.kind == "shapes":
        return list(SHAPES_PROMPTS)
    raise ConfigError("No prompts: set sample.prompts=[...] or sample.prompt_file=<text file, one prompt a line>.")


def load_video_model(cfg, ckpt: str, ranks: SamplingRanks
                     ) -> Tuple[Union[nn.Module, FamilyDenoiser], CaptionEncoder, Optional[VideoVAE]]:
    """(model, caption encoder, VAE or None) for checkpoint ``ckpt`` (``find_video_checkpoint``):
    the model sequence-parallel over ``ranks.sp_group`` and compiled when ``sample.compile``, in
    eval mode on ``ranks.device``; a diffusers family's model is returned through its adapter
    (``FamilyDenoiser``), the denoiser the samplers call."""
    model = load_denoiser(build_video_model(cfg), cfg, ckpt, ranks)
    denoiser = family_denoiser(cfg, model) if is_family(cfg.model.name) else model
    return denoiser, load_caption_encoder(cfg, ranks.device), load_video_vae(cfg, ranks.device)


@torch.no_grad()
def sample_clips(model, cfg, states: torch.Tensor, mask: torch.Tensor, indices, device,
                 progress: bool = False, downsample: int = 1, fast: FastSampling = PLAIN) -> torch.Tensor:
    """Caption states [n, M, Cy] of global prompts ``indices`` -> clips [n, C, T, H, W] in model space
    (latents or pixels), of the trained clip shape or the one ``sample.num_frames/height/width`` ask
    for. Each clip's noise comes from (sample.seed, its index), so the result does not depend on
    which prompts share the batch, rank or world size. ``fast``: ``fast_sampling``'s CFG-parallel
    branches and step cache."""
    generators = SampleGenerators(cfg.sample.seed, indices)
    shape = sample_clip_shape(cfg, downsample, model.patch_size)
    z = generators.standard_normal((states.shape[0], *shape), device, torch.float32)  # [n, C, T, H, W]
    # Guidance by the model's layout (video models: [captions; learned null caption] as one batch of 2n).
    guided = fast.guided(model, cfg.sample.cfg_scale)
    with fast.trajectory():
        return denoise(guided, z, cfg, dict(y=states, mask=mask), clip_denoised=pixel_space(cfg), device=device,
                       generator=generators, progress=progress)


def video_batches(model, cfg, prompts: List[str], ranks: SamplingRanks, captions: CaptionEncoder,
                  vae: Optional[VideoVAE] = None, fast: FastSampling = PLAIN) -> Iterator[Tuple[range, torch.Tensor]]:
    """This rank's block of ``prompts`` in batches of ``sample.batch_size``: yields (global indices,
    clips [b, C, T, H, W] on the CPU, decoded to pixels [b, 3, T, H', W'] by ``vae`` when given).
    Rank 0 shows the sampling steps."""
    for indices in ranks.batches(len(prompts), cfg.sample.batch_size):
        states, mask = captions.encode([prompts[i] for i in indices], ranks.device)      # [n, M, Cy], [n, M]
        clips = sample_clips(model, cfg, states, mask, indices, ranks.device, progress=ranks.is_main,
                             downsample=vae.downsample if vae is not None else 1, fast=fast)  # [n, C, T, H, W]
        if vae is not None:
            clips = vae.decode(clips)                                                # [n, 3, T, H', W']
        yield indices, clips.float().cpu()


def sample_prompts(cfg) -> List[str]:
    """sample_video.py's work for a checked config: the prompts sampled from the run's checkpoint on
    every rank (through the run's pipeline for a run from ``model.pipeline``, ``pipeline_sampling.py``) and, on
    rank 0, written as videos (an image pipeline's as PNGs) and a contact sheet; returns their paths
    (empty on the other ranks)."""
    ckpt = find_video_checkpoint(cfg)  # adopts the trained model, objective and text-encoder kind
    prompts = read_prompts(cfg)
    fast = PLAIN
    with sampling_ranks(cfg.sp_size, cfg.sample.cfg_parallel) as ranks:
        if cfg.model.pipeline:
            pipe = load_trained_pipeline(cfg, ckpt, ranks)
            batches = pipeline_batches(pipe, cfg, prompts, ranks)
            source = f"{ckpt} through {type(pipe).__name__}"
        else:
            model, captions, vae = load_video_model(cfg, ckpt, ranks)
            fast = fast_sampling(model, cfg, ranks)
            batches = video_batches(model, cfg, prompts, ranks, captions, vae, fast=fast)
            source = f"{ckpt} (cfg_scale {cfg.sample.cfg_scale})"
        mine = [clips for _, clips in batches]
        clips = gather_on_main(torch.cat(mine) if mine else torch.empty(0), ranks)
        if not ranks.is_main:
            return []
    out_dir = cfg.sample.output_dir or default_output(os.path.join(cfg.results_dir, cfg.exp_name), ckpt)
    if cfg.model.pipeline and family_of(cfg.model.name).adapter.image_only:
        paths = write_images(clips[:, :, 0], prompts, out_dir)
    else:
        paths = write_videos(clips, prompts, out_dir, cfg.sample.fps)
    print(f"sampled {len(prompts)} prompts from {source} (seed {cfg.sample.seed}, {ranks.dp_size} data-parallel x "
          f"{ranks.sp_size} sequence-parallel ranks):")
    for path in paths:
        print(path)
    if fast.cache is not None:
        print(fast.cache.summary() + " on rank 0")
    return paths
