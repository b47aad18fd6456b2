"""Text-to-video sampling: the model, caption encoder and VAE for a checkpoint, the prompts, and
batches of clips for this rank's block of prompts (sample_video.py writes them as videos and a
contact sheet). The sampler and the checkpoint handling are those of every sampling run
(``sampler.py``, ``denoiser.py``); what is particular to videos is here: prompts and their caption
states, the clip shape (``sample.num_frames/height/width``), and guidance by the model's layout."""

import os
from typing import Iterator, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from ..builders.diffusers_model import family_denoiser, is_family
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
from ..families import FamilyDenoiser
from .denoiser import adopt_trained_sections, find_sample_checkpoint, load_denoiser
from .fast import PLAIN, FastSampling
from .sampler import check_sampler, denoise
from .sharding import SamplingRanks

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
    path = cfg.text_encoder.path
    adopt_trained_sections(cfg, saved, ("model", "diffusion", "text_encoder"))
    if cfg.model.pipeline:
        raise ConfigError(f"{ckpt!r} was trained from the pipeline folder {cfg.model.pipeline!r}; sample_video.py "
                          f"does not sample through that pipeline in this version: load the run's diffusers/ export "
                          f"into the pipeline ({cfg.model.name}.from_pretrained, or load_lora_weights) and call it.")
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
