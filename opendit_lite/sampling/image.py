"""Class-conditional image sampling: the model from a checkpoint, and batches of samples for this
rank's block of global sample indices (sample.py writes a grid of them, the evaluator an .npz)."""

from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..build.denoiser import parallelize_denoiser
from ..build.image import (
    build_dataset_from_config,
    build_model_from_config,
    load_vae_from_config,
    model_input_hw,
    resolve_model_geometry,
)
from ..build.lora import load_merged
from ..checkpoint.layout import resolve_sample_checkpoint, saved_config
from ..config import ConfigError, DiffusionConfig, ModelConfig, from_dict
from ..diffusion import RectifiedFlow, cfg_model_fn, create_diffusion
from ..diffusion.sampling_utils import SampleGenerators
from ..encoders import vae_decode
from .checks import check_sample_settings
from .ranks import SamplingRanks


def load_image_model(cfg, ranks: SamplingRanks) -> Tuple[nn.Module, str, Optional[nn.Module], object]:
    """(model, checkpoint path, VAE or None, dataset or None) for ``sample.ckpt`` (or the run's
    newest checkpoint). The model, sequence-parallel over ``ranks.sp_group`` and compiled when
    ``sample.compile``, is in eval mode on ``ranks.device``; ``cfg.model``/``cfg.diffusion`` are
    replaced in place by those saved with the checkpoint."""
    ckpt = resolve_sample_checkpoint(cfg, cfg.sample.ckpt, "train.py", family="image")
    dataset = None
    vae = load_vae_from_config(cfg, ranks.device)
    saved = saved_config(ckpt)  # the resolved config train.py stored with its checkpoint
    if "model" in saved:
        cfg.model = from_dict(ModelConfig, saved["model"], "model.")
        cfg.diffusion = from_dict(DiffusionConfig, saved["diffusion"], "diffusion.")
    else:
        if cfg.model.num_classes is None:
            dataset = build_dataset_from_config(cfg)
        resolve_model_geometry(cfg, dataset, vae)
    flow = cfg.diffusion.objective == "rflow"
    if flow != (cfg.sample.sampler == "euler"):
        raise ConfigError(f"'sample.sampler'={cfg.sample.sampler!r} does not fit a model trained with "
                          f"diffusion.objective={cfg.diffusion.objective!r}: use "
                          + ("sample.sampler=euler." if flow else "sample.sampler=ddpm or ddim."))
    check_sample_settings(cfg.sample.seed, cfg.sample.batch_size)
    model = build_model_from_config(cfg)
    load_merged(model, ckpt, use_ema=cfg.sample.use_ema, lora=saved.get("lora"))  # LoRA runs: adapters merged
    report = parallelize_denoiser(model, cfg, ranks.sp_group)
    if ranks.is_main and (ranks.sp_size > 1 or cfg.sample.compile):
        print(report)
    model.to(ranks.device).eval()
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
                  progress: bool = False) -> torch.Tensor:
    """labels [n] of global samples ``indices`` -> images [n, C, H, W] in model space (latents or
    pixels). Each sample's noise comes from (sample.seed, its index), so the result does not depend
    on which samples share the batch. Guidance is batched: [conditional; unconditional] is one
    forward of 2n rows."""
    n, (h, w) = len(labels), model_input_hw(cfg)
    s = cfg.sample
    generators = SampleGenerators(s.seed, indices)
    z = generators.standard_normal((n, cfg.model.in_channels, h, w), device, torch.float32)  # [n, C, H, W]
    y_null = torch.full_like(labels, cfg.model.num_classes)
    z2, y2 = torch.cat([z, z]), torch.cat([labels, y_null])  # [2n, ...]: [conditional; unconditional]
    if s.sampler == "euler":
        rf = RectifiedFlow(num_timesteps=cfg.diffusion.diffusion_steps)
        out = rf.sample(model, noise=z2, model_kwargs=dict(y=y2), num_steps=s.num_sampling_steps,
                        cfg_scale=s.cfg_scale, progress=progress, generator=generators)
    else:
        prefix = "ddim" if s.sampler == "ddim" else ""
        diffusion = create_diffusion(f"{prefix}{s.num_sampling_steps}", noise_schedule=cfg.diffusion.noise_schedule,
                                     learn_sigma=cfg.model.learn_sigma, diffusion_steps=cfg.diffusion.diffusion_steps)
        loop = diffusion.ddim_sample_loop if s.sampler == "ddim" else diffusion.p_sample_loop
        # The reference's guidance of the first 3 channels, so original checkpoints reproduce their samples.
        guided = cfg_model_fn(model, s.cfg_scale, channels=3)
        out = loop(guided, z2.shape, z2, clip_denoised=not cfg.vae.path,  # pixels live in [-1, 1]
                   model_kwargs=dict(y=y2), progress=progress, device=device, generator=generators)
    return out[:n]


def image_batches(model, cfg, labels: Sequence[int], ranks: SamplingRanks, vae=None,
                  step_progress: bool = False) -> Iterator[Tuple[range, torch.Tensor]]:
    """This rank's block of the samples whose labels are ``labels`` (one per global index), in
    batches of ``sample.batch_size``: yields (global indices, images [b, 3, H, W] in [-1, 1] on the
    CPU, decoded by ``vae`` when given). Rank 0 shows a bar over batches when there are several,
    and over sampling steps when ``step_progress``."""
    block = ranks.shard(len(labels))
    starts = range(block.start, block.stop, cfg.sample.batch_size)
    if ranks.is_main and len(starts) > 1:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"sampling (rank 0: {len(block)} of {len(labels)})", unit="batch")
    for start in starts:
        indices = range(start, min(start + cfg.sample.batch_size, block.stop))
        y = torch.tensor([labels[i] for i in indices], device=ranks.device)
        images = sample_images(model, cfg, y, indices, ranks.device, progress=step_progress and ranks.is_main)
        if vae is not None:
            images = vae_decode(vae, images, cfg.vae.scale_factor)
        yield indices, images.float().cpu()
