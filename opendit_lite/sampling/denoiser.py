"""The denoiser of a sampling run, for images and videos alike: the checkpoint to sample from (of
the sampler's model family), the trained sections adopted from its saved config, and the model
with its weights (EMA by default, LoRA merged), parallelized for sampling and in eval mode."""

import os

import torch.nn as nn

from ..builders.distill_model import check_student_sampling, load_student
from ..builders.family import SCRIPTS, check_model_family
from ..builders.lora_checkpoint import load_merged
from ..builders.parallelize import parallelize_from_config
from ..checkpoint.layout import check_saved_model, resolve_sample_checkpoint, saved_config
from ..config import from_dict
from ..models import MODELS
from .sharding import SamplingRanks


def find_sample_checkpoint(cfg, family: str) -> str:
    """``sample.ckpt``, or the newest complete checkpoint of the run; a checkpoint folder must hold a
    model of ``family`` ("image" or "video"), else a ConfigError names the sampler that takes it."""
    ckpt = resolve_sample_checkpoint(cfg, cfg.sample.ckpt, SCRIPTS[family]["train"])
    name = saved_config(ckpt).get("model", {}).get("name") if os.path.isdir(ckpt) else None
    if name in MODELS:
        check_model_family(name, family, role="sample", subject=f"{ckpt!r} holds {name}, which")
    check_saved_model(ckpt, "sample.ckpt", cfg.model.name)
    return ckpt


def adopt_trained_sections(cfg, saved: dict, sections=("model", "diffusion")) -> None:
    """Replace ``cfg``'s ``sections`` by those of ``saved``, the resolved config the trainer stored
    with its checkpoint, in place: the sampler builds exactly the trained model and objective."""
    for section in sections:
        setattr(cfg, section, from_dict(type(getattr(cfg, section)), saved[section], f"{section}."))


def load_denoiser(model: nn.Module, cfg, ckpt: str, ranks: SamplingRanks) -> nn.Module:
    """``model`` (freshly built) with ``ckpt``'s weights (``sample.use_ema``; a LoRA run's adapters
    merged; a distillation run's student, checked against ``sample.*``), parallelized for sampling over
    ``ranks.sp_group`` (``parallelize_from_config``:
    kernels, Ulysses/DSP, ``sample.compile``), in eval mode on ``ranks.device``. Rank 0 prints the
    parallelize report when the model is sequence-parallel or compiled."""
    saved = saved_config(ckpt)
    lora = saved.get("lora")
    if (saved.get("distill") or {}).get("teacher"):  # a distillation run's checkpoint: its student
        check_student_sampling(cfg, saved)
        load_student(model, ckpt, use_ema=cfg.sample.use_ema, lora=lora)
        if ranks.is_main:
            print(f"sampling the {saved['distill']['student_timesteps']}-step student of {ckpt}")
    else:
        load_merged(model, ckpt, use_ema=cfg.sample.use_ema, lora=lora)
        if ranks.is_main and lora and lora.get("rank"):
            print(f"merged the LoRA adapters of {ckpt} (rank {lora['rank']}, alpha {lora['alpha']:g}) into its base "
                  f"weights for sampling")
    report = parallelize_from_config(model, cfg, ranks.sp_group, sampling=True)
    if ranks.is_main and (ranks.sp_size > 1 or cfg.sample.compile):
        print(report)
    return model.to(ranks.device).eval()
