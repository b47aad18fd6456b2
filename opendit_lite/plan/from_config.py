"""Configs turned into the planner's inputs: a model shape read from a model built on the meta
device, the buckets in latent units, the bytes of an activation element from the resolved
precision; then the plan for a config (``plan_config``) and the batch of each bucket for
``bucket_batch: auto`` (``plan_bucket_batches``). The memory arithmetic is in ``memory_model.py``
and the choice in ``planner.py``."""

import copy
import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..builders.diffusers_model import diffusers_config, family_adapter, is_family
from ..builders.family import config_family
from ..builders.geometry import (
    LatentBucket,
    config_downsample,
    latent_buckets,
    latent_folder_size,
    sp_auto_inputs,
)
from ..builders.pipeline_experts import resolve_expert
from ..config import ConfigError
from ..families import FamilyDenoiser
from ..models.blocks import find_blocks
from ..models.experts import NoiseExperts
from ..parallel import declared_sp_modes, resolve_auto, sharded_heads
from ..parallel.modes import mode_candidates
from ..precision import Precision, resolve_precision
from .activation_count import counted_profile
from .memory_model import ModelShape
from .planner import Plan, Setting, plan

CAPTION_WIDTHS = {"shapes": 32, "t5": 4096, "clip": 768}


def model_of_config(cfg, device="meta") -> nn.Module:
    """The config's model with the geometry a run would resolve from its data, built on ``device`` (the
    meta device: no memory, no weights; a diffusers family from its config, never its weights)."""
    cfg = copy.deepcopy(cfg)
    latent = config_downsample(cfg) > 1
    m = cfg.model
    m.in_channels = m.in_channels or (4 if latent else 3)
    with torch.device(device):
        if config_family(cfg) == "video":
            from ..builders.video import build_video_model

            if is_family(m.name):
                resolve_expert(cfg)  # Wan 2.2's experts: both, or the one trained
                both = m.expert == "both"
                m.config, m.path, m.expert = diffusers_config(cfg), None, None  # from its config, never its weights
                if both:  # the experts share one architecture
                    return NoiseExperts(build_video_model(cfg), build_video_model(cfg), boundary=0.0)
            else:
                m.caption_channels = m.caption_channels or CAPTION_WIDTHS[cfg.text_encoder.kind]
            return build_video_model(cfg)
        from ..builders.image import build_model_from_config

        size = cfg.data.image_size // config_downsample(cfg)
        m.input_size = m.input_size or [size, size]
        m.num_classes = m.num_classes or 1000
        return build_model_from_config(cfg)


def model_shape_of_config(cfg, model: Optional[nn.Module] = None,
                          precision: Optional[Precision] = None) -> ModelShape:
    """The shape of the config's model (built on the meta device unless given): a diffusers family's
    saved activations counted from its forward in the training dtype of ``precision`` (default:
    ``plan_precision(cfg)``; ``family_shape``), the zoo's from their profiles."""
    model = model if model is not None else model_of_config(cfg)
    if isinstance(model, NoiseExperts):  # Wan 2.2: a sample runs through one expert; both experts' weights are held
        one = family_shape(model.transformer, cfg.text_encoder.max_length, cfg.model.name)
        return dataclasses.replace(one, params=sum(p.numel() for p in model.parameters()))
    if is_family(model):
        precision = precision or plan_precision(cfg)
        dtype = precision.autocast_dtype or torch.float32
        return family_shape(model, cfg.text_encoder.max_length, cfg.model.name, dtype=dtype)
    return ModelShape.of(model, cfg.model.name)


def family_shape(model: nn.Module, caption_tokens: int, name: Optional[str] = None,
                 dtype: torch.dtype = torch.float32) -> ModelShape:
    """The shape of a diffusers family's model (a meta-device one is enough), its activation profile
    counted from two meta forwards through the family's adapter (one clip of 2 latent frames, 4 x 4 and
    8 x 4 patches; images: 1 frame) with ``caption_tokens`` caption tokens, the model cast to ``dtype``
    (the training dtype: the profile's widths are of that dtype's elements)."""
    if next(model.parameters()).dtype != dtype:
        model = nn.Module.to(copy.deepcopy(model), dtype)  # meta: only the modules are copied (no diffusers warning)
    adapter, config = family_adapter(model), model.config
    pt, ph, pw = adapter.patch_size(config)
    frames = 1 if adapter.image_only else 2 * pt
    grids = [(frames, 4 * ph, 4 * pw), (frames, 8 * ph, 4 * pw)]
    text_width = adapter.text_width(config)
    denoiser = FamilyDenoiser(adapter, model, config, caption_tokens, text_width)
    device = next(model.parameters()).device

    def step(i: int):
        T, H, W = grids[i]
        x = torch.zeros(1, adapter.latent_channels(config), T, H, W, device=device, dtype=dtype)
        t = torch.full((1,), 500.0, device=device)
        y = torch.zeros(1, caption_tokens, text_width, device=device, dtype=dtype)
        mask = torch.ones(1, caption_tokens, dtype=torch.bool, device=device)
        return lambda: denoiser(x, t, y, mask)

    tokens = [-(-T // pt) * (H // ph) * (W // pw) for T, H, W in grids]
    hidden = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    profile = counted_profile(model, hidden, step, tuple(tokens), caption_tokens,
                              element_bytes=torch.finfo(dtype).bits // 8)
    return ModelShape.counted(model, name or type(model).__name__, hidden, int(config["num_attention_heads"]),
                              (pt, ph, pw), len(find_blocks(model)), profile)


def plan_precision(cfg) -> Precision:
    """The precision a plan assumes without a run: the config's, resolved for a CUDA device (the
    planner sizes GPUs: ``auto`` is bf16 there)."""
    return resolve_precision(cfg.precision, "cuda")


def plan_config(cfg, memory_gib: float, world_size: int, max_batch: int = 256, min_batch: int = 1,
                reserve_gib: float = 1.0, fixed: bool = False, precision: Optional[Precision] = None,
                ranks_per_node: int = 8) -> Tuple[Plan, List[LatentBucket], ModelShape]:
    """Plan a config. ``fixed``: keep the config's zero_degree/sp_size/selective_ratio/ac_offload and only
    size the buckets (what ``bucket_batch: auto`` does inside a run whose settings are already chosen).
    ``precision``: the run's resolved precision (None: ``plan_precision(cfg)``); ``ranks_per_node``: GPUs
    per node (an SP group larger than a node spans nodes). SP sizes are those at which some mode runs
    (ulysses, dsp, usp, ring); the plan's ``sp_choice`` is the mode ``sp_mode: auto`` takes at its
    sp_size and why (the same decision a run makes: ``builders.geometry.sp_auto_inputs``)."""
    precision = precision or plan_precision(cfg)
    model = model_of_config(cfg)
    shape = model_shape_of_config(cfg, model, precision)
    buckets = latent_buckets(cfg)
    settings = [Setting(cfg.zero_degree, cfg.sp_size, cfg.selective_ratio, cfg.ac_offload)] if fixed else None
    caption = cfg.text_encoder.max_length if config_family(cfg) == "video" else 0

    def auto(sp_size: int):
        return sp_auto_inputs(model, cfg, sp_size, ranks_per_node)

    heads, modes = sharded_heads(model), declared_sp_modes(model)
    sp_sizes = [p for p in (1, 2, 4, 8, 16, 32) if world_size % p == 0
                and (p == 1 or mode_candidates(heads, p, modes, auto(p).workload))]
    try:
        result = plan(shape, buckets, memory_gib, world_size, element_bytes=precision.element_bytes,
                      caption_tokens=caption, reserve_gib=reserve_gib, min_batch=min_batch, max_batch=max_batch,
                      settings=settings, sp_sizes=sp_sizes)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    sp = result.setting.sp_size
    if sp > 1:
        result.sp_choice = resolve_auto(model, sp, auto(sp))
    result.sp_requested = cfg.sp_mode
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


__all__ = ["LatentBucket", "ModelShape", "Plan", "Setting", "latent_buckets", "family_shape", "model_of_config",
           "model_shape_of_config", "plan",
           "plan_bucket_batches", "plan_config", "plan_precision"]
