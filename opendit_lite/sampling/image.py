"""Class-conditional image sampling: the model from a checkpoint, and batches of samples for this
rank's block of global sample indices (sample.py writes a grid of them, the evaluator an .npz).
The sampler and the checkpoint handling are those of every sampling run (``sampler.py``,
``denoiser.py``); what is particular to images is here: class labels, the doubled batch of
guidance, and DiT's guidance of three channels under IDDPM."""

from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..builders.image import (
    build_dataset_from_config,
    build_model_from_config,
    load_vae_from_config,
    model_input_hw,
    resolve_model_geometry,
)
from ..checkpoint.layout import saved_config
from ..config import ConfigError
from ..diffusion.sampling_utils import SampleGenerators
from ..encoders import vae_decode
from .denoiser import adopt_trained_sections, find_sample_checkpoint, load_denoiser
from .fast import PLAIN, FastSampling
from .sampler import check_sampler, denoise
from .sharding import SamplingRanks


def load_image_model(cfg, ranks: SamplingRanks) -> Tuple[nn.Module, str, Optional[nn.Module], object]:
    """(model, checkpoint path, VAE or None, dataset or None) for ``sample.ckpt`` (or the run's
    newest checkpoint). The model, sequence-parallel over ``ranks.sp_group`` and compiled when
    ``sample.compile``, is in eval mode on ``ranks.device``; ``cfg.model``/``cfg.diffusion`` are
    replaced in place by those saved with the checkpoint (an original DiT checkpoint saves none:
    the geometry then comes from the config's data and VAE)."""
    ckpt = find_sample_checkpoint(cfg, "image")
    dataset = None
    vae = load_vae_from_config(cfg, ranks.device)
    saved = saved_config(ckpt)  # the resolved config train.py stored with its checkpoint
    if "model" in saved:
        adopt_trained_sections(cfg, saved)
    else:
        if cfg.model.num_classes is None:
            dataset = build_dataset_from_config(cfg)
        resolve_model_geometry(cfg, dataset, vae, fed_data=False)  # sampling starts from noise of the model's size
    check_sampler(cfg)
    model = load_denoiser(build_model_from_config(cfg), cfg, ckpt, ranks)
    return model, ckpt, vae, dataset


def class_labels(num_classes: int, labels: Optional[Sequence[int]], per_class: int) -> List[int]:
    """The label of every global sample index: each class in ``labels`` (None: all ``num_classes``)
    ``per_class`` times in a row."""
    labels = list(range(num_classes)) if labels is None else list(labels)
    bad = [lab for lab in labels if not 0 <= lab < num_classes]
    if bad:
        raise ConfigError(f"class labels {bad} are outside 0..{num_classes - 1}, the model's classes.")
    return [lab for lab in labels for _ in range(per_class)]


@torch.no_grad()
def sample_images(model, cfg, labels: torch.Tensor, indices: Sequence[int], device,
                  progress: bool = False, fast: FastSampling = PLAIN) -> torch.Tensor:
    """labels [n] of global samples ``indices`` -> images [n, C, H, W] in model space (latents or
    pixels). Each sample's noise comes from (sample.seed, its index), so the result does not depend
    on which samples share the batch. Guidance is batched: [conditional; unconditional] is one
    forward of 2n rows (``fast``: split over CFG-parallel ranks, through a step cache)."""
    n, (h, w) = len(labels), model_input_hw(cfg)
    generators = SampleGenerators(cfg.sample.seed, indices)
    z = generators.standard_normal((n, cfg.model.in_channels, h, w), device, torch.float32)  # [n, C, H, W]
    y_null = torch.full_like(labels, cfg.model.num_classes)
    z2, y2 = torch.cat([z, z]), torch.cat([labels, y_null])  # [2n, ...]: [conditional; unconditional]
    # Under IDDPM the reference guides the first 3 channels, so original checkpoints reproduce their samples.
    channels = None if cfg.sample.sampler == "euler" else 3
    guided = fast.guided(model, cfg.sample.cfg_scale, channels=channels)
    with fast.trajectory():
        out = denoise(guided, z2, cfg, dict(y=y2), clip_denoised=not cfg.vae.path,  # pixels live in [-1, 1]
                      device=device, generator=generators, progress=progress)
    return out[:n]


def image_batches(model, cfg, labels: Sequence[int], ranks: SamplingRanks, vae=None,
                  step_progress: bool = False, fast: FastSampling = PLAIN) -> Iterator[Tuple[range, torch.Tensor]]:
    """This rank's block of the samples whose labels are ``labels`` (one per global index), in
    batches of ``sample.batch_size``: yields (global indices, images [b, 3, H, W] in [-1, 1] on the
    CPU, decoded by ``vae`` when given). Rank 0 shows a bar over batches when there are several,
    and over sampling steps when ``step_progress``. ``fast``: ``fast_sampling``'s CFG-parallel
    branches and step cache."""
    for indices in ranks.batches(len(labels), cfg.sample.batch_size):
        y = torch.tensor([labels[i] for i in indices], device=ranks.device)
        images = sample_images(model, cfg, y, indices, ranks.device, progress=step_progress and ranks.is_main,
                               fast=fast)
        if vae is not None:
            images = vae_decode(vae, images, cfg.vae.scale_factor)
        yield indices, images.float().cpu()
