"""Configs turned into the planner's inputs: a model shape read from a model built on the meta
device, the buckets in latent units, the bytes of an activation element from the resolved
precision; then the plan for a config (``plan_config``) and the batch of each bucket for
``bucket_batch: auto`` (``plan_bucket_batches``). The memory arithmetic is in ``memory_model.py``
and the choice in ``planner.py``."""

import copy
import dataclasses
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

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
from ..families import FamilyDenoiser, Release, conditioning_of_pipeline
from ..memory.low_precision import BASE_PRECISIONS
from ..models.blocks import find_blocks
from ..models.experts import NoiseExperts
from ..models.lora import apply_lora
from ..parallel import declared_sp_modes, resolve_auto, sharded_heads
from ..parallel.modes import mode_candidates
from ..precision import Precision, resolve_precision
from .activation_count import counted_profile
from .memory_model import (
    ADAM_K,
    GiB,
    ModelShape,
    activation_bytes,
    ema_bytes,
    model_state_bytes,
    offloaded_activation_bytes,
    sample_tokens,
)
from .planner import HostBudget, MemoryOptions, Plan, Setting, plan, smallest_card
from .released import released_config
from .weight_costs import (
    Speed,
    WeightShape,
    dequantize_seconds,
    frozen_device_bytes,
    host_bytes,
    optim_offload_seconds,
    step_seconds,
    swap_seconds,
    working_bytes,
)

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
                # from its config, never its weights
                m.config, m.path, m.pipeline, m.expert = diffusers_config(cfg), None, None, None
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
    8 x 4 patches, or more where the model pads its tokens to a multiple, ``token_multiple``; images: 1
    frame) with ``caption_tokens`` caption tokens, the model cast to ``dtype``
    (the training dtype: the profile's widths are of that dtype's elements)."""
    if next(model.parameters()).dtype != dtype:
        model = nn.Module.to(copy.deepcopy(model), dtype)  # meta: only the modules are copied (no diffusers warning)
    adapter, config = family_adapter(model), model.config
    pt, ph, pw = adapter.patch_size(config)
    frames = 1 if adapter.image_only else 2 * pt
    side = 4  # patches per side, doubled until both clips' tokens are whole multiples the model pads to
    while (frames // pt) * side * side % adapter.token_multiple(config):
        side *= 2
    grids = [(frames, side * ph, side * pw), (frames, 2 * side * ph, side * pw)]
    text_width = adapter.text_width(config)
    # the adapter's counting_forward: its forward without reading input values (meta tensors have none)
    denoiser = FamilyDenoiser(adapter, model, config, caption_tokens, text_width, counting=True)
    device = next(model.parameters()).device

    def step(i: int):
        T, H, W = grids[i]
        x = torch.zeros(1, adapter.latent_channels(config), T, H, W, device=device, dtype=dtype)
        t = torch.full((1,), 500.0, device=device)
        y = torch.zeros(1, caption_tokens, text_width, device=device, dtype=dtype)
        mask = torch.ones(1, caption_tokens, dtype=torch.bool, device=device)
        return lambda: denoiser(x, t, y, mask)

    tokens = [-(-T // pt) * (H // ph) * (W // pw) for T, H, W in grids]
    hidden = adapter.hidden_size(config)
    try:
        profile = counted_profile(model, hidden, step, tuple(tokens), caption_tokens,
                                  element_bytes=torch.finfo(dtype).bits // 8)
    except (RuntimeError, NotImplementedError) as e:
        if device.type != "meta" or "meta" not in str(e):
            raise
        # a forward that branches on its inputs' values or selects tokens by mask, with no counting_forward
        # of its family's adapter to run instead: neither runs on the meta device, where the count runs.
        raise ConfigError(f"{name or type(model).__name__}'s forward reads its inputs' values ({e}), which the "
                          f"planner's meta-device count of its activations cannot run, and its family's adapter "
                          f"gives no counting_forward that does without them: it cannot plan this model yet. "
                          f"Choose its memory settings by measuring a few steps instead.") from None
    return ModelShape.counted(model, name or type(model).__name__, hidden, adapter.attention_heads(config),
                              (pt, ph, pw), len(find_blocks(model)), profile)


def plan_precision(cfg) -> Precision:
    """The precision a plan assumes without a run: the config's, resolved for a CUDA device (the
    planner sizes GPUs: ``auto`` is bf16 there)."""
    return resolve_precision(cfg.precision, "cuda")


def memory_settings(cfg) -> Tuple[int, str, float]:
    """(memory.blocks_to_swap, lora.base_precision, memory.gemini_offload_optim_frac) of a config."""
    memory = getattr(cfg, "memory", None)
    return (getattr(memory, "blocks_to_swap", 0), getattr(cfg.lora, "base_precision", "none") or "none",
            getattr(memory, "gemini_offload_optim_frac", 0.0))


def distilling(cfg) -> bool:
    """Whether ``cfg`` is a few-step distillation (``distill.teacher`` set)."""
    distill = getattr(cfg, "distill", None)
    return bool(distill is not None and distill.teacher)


def adapted_model(cfg, model: nn.Module) -> nn.Module:
    """``model`` (meta device) with the config's LoRA adapters when it trains them. A LoRA distillation
    trains two adapters of rank r (student and critic) on the same layers: counted as one of rank 2r, which
    holds as many parameters, gradients, optimizer states and EMA entries."""
    if cfg.lora.rank:
        rank = cfg.lora.rank * (2 if distilling(cfg) else 1)
        with torch.device("meta"):  # the adapters too: nothing allocated, nothing initialised
            apply_lora(model, rank=rank, alpha=cfg.lora.alpha, dropout=cfg.lora.dropout, targets=cfg.lora.targets)
    return model


@dataclasses.dataclass(frozen=True)
class Costs:
    """A setting's weight-memory bytes and step-time costs for one planned run (``weight_costs.py``)."""

    shape: ModelShape
    weights: WeightShape
    world_size: int
    element_bytes: int
    tokens: int          # video tokens of one sample of the largest bucket
    speed: Speed
    buckets: Tuple[LatentBucket, ...] = ()
    caption_tokens: int = 0
    ema: bool = True     # the run keeps the sharded fp32 EMA of its trainable parameters

    def per_sample(self, s: Setting) -> Dict[str, float]:
        """Activation GiB per sample of each bucket under ``s``."""
        return {b.name: activation_bytes(self.shape, b.frames, b.height, b.width, 1, self.element_bytes, s.sp_size,
                                         s.selective_ratio, s.offload, self.caption_tokens, b.extra_tokens) / GiB
                for b in self.buckets}

    def states(self, s: Setting) -> float:
        """Device bytes of weights, gradients, optimizer states and EMA."""
        w = self.weights
        trained = model_state_bytes(s.zero_degree, w.trainable, self.world_size)
        if s.zero_degree == 3:
            trained -= ADAM_K * w.trainable * s.optim_offload / self.world_size
        frozen = frozen_device_bytes(w, s.zero_degree, self.element_bytes, s.base_precision, s.blocks_to_swap)
        return frozen + trained + (ema_bytes(w.trainable, self.world_size) if self.ema else 0)

    def host(self, s: Setting) -> float:
        """Host bytes per rank of the weight-memory settings (swapped blocks, kept originals, optimizer offload)."""
        return host_bytes(self.weights, s.zero_degree, self.element_bytes, s.base_precision, s.blocks_to_swap,
                          s.optim_offload, self.world_size)

    def host_per_sample(self, s: Setting, bucket: LatentBucket) -> float:
        """Host bytes per rank of one sample's offloaded activations (``ac_offload``)."""
        return offloaded_activation_bytes(self.shape, bucket.frames, bucket.height, bucket.width, 1,
                                          self.element_bytes, s.sp_size, s.selective_ratio, s.offload,
                                          bucket.extra_tokens)

    def seconds(self, s: Setting) -> Dict[str, float]:
        """Compute seconds of one sample's step at batch 1, and what each weight-memory setting adds."""
        w, tokens = self.weights, -(-self.tokens // s.sp_size)
        # A sample runs through shape.depth blocks: all of w's, or one expert's of Wan 2.2's two (whose
        # weights w counts both), so only that share of the base is dequantized per sample.
        depth = self.shape.depth
        recomputed = depth * (1 - s.selective_ratio)
        block = w.block_bytes(s.base_precision, working_bytes(s.zero_degree, self.element_bytes))
        dequantize = dequantize_seconds(w, s.base_precision, 2 + recomputed / depth, self.speed) * depth / w.depth
        return {"step": step_seconds(w, self.shape.hidden_size, tokens, recomputed, self.speed, depth),
                "blocks_to_swap": swap_seconds(w, self.shape.hidden_size, tokens, s.blocks_to_swap, block, self.speed),
                "base_precision": dequantize,
                "optim_offload": optim_offload_seconds(w, s.optim_offload, self.world_size, self.speed)}

    def extra_cost(self, s: Setting) -> float:
        """The weight-memory settings' time relative to the step's compute (added to ``Setting.cost``)."""
        seconds = self.seconds(s)
        return sum(v for k, v in seconds.items() if k != "step") / seconds["step"]


def memory_options(weights: WeightShape, world_size: int) -> MemoryOptions:
    """What the planner may set: a LoRA run swaps 0..depth blocks and stores its base in bf16, FP8 or NF4,
    with ZeRO-2 even on one device (its bf16 working weights; DDP keeps fp32 ones); a full fine-tune
    may offload Gemini's optimizer states (zero_degree 3, also on one device)."""
    if weights.lora:
        return MemoryOptions(blocks_to_swap=tuple(range(weights.depth + 1)), base_precisions=BASE_PRECISIONS,
                             zero_degrees=(2, 1, 0))
    return MemoryOptions(optim_offloads=(0.0, 0.5, 1.0), zero_degrees=(0, 3) if world_size == 1 else None)


HOST_RESERVE_FRACTION = 0.1   # of the host memory, for the operating system and page cache
HOST_GIB_PER_RANK = 2.0       # each training process itself: Python, libraries, CUDA's host side, data loading


def host_budget(costs: Costs, host_gib: float, ranks: int) -> HostBudget:
    """The host memory of a node of ``host_gib`` GiB that ``ranks`` training processes leave to the settings:
    ``host_gib`` less 10% and ``HOST_GIB_PER_RANK`` per process."""
    usable = host_gib * (1 - HOST_RESERVE_FRACTION) - HOST_GIB_PER_RANK * ranks
    return HostBudget(usable, ranks, costs.host, costs.host_per_sample)


def plan_config(cfg, memory_gib: float, world_size: int, max_batch: int = 256, min_batch: int = 1,
                reserve_gib: float = 1.0, fixed: bool = False, precision: Optional[Precision] = None,
                ranks_per_node: int = 8, speed: Optional[Speed] = None,
                host_gib: Optional[float] = None) -> Tuple[Plan, List[LatentBucket], ModelShape]:
    """Plan a config. ``fixed``: keep the config's zero_degree/sp_size/selective_ratio/ac_offload (and
    memory.blocks_to_swap, lora.base_precision) and only size the buckets (what ``bucket_batch: auto``
    does inside a run whose settings are already chosen). ``precision``: the run's resolved precision
    (None: ``plan_precision(cfg)``); ``ranks_per_node``: GPUs per node (an SP group larger than a node
    spans nodes); ``speed``: the device throughputs the step-time costs assume; ``host_gib``: host memory
    per node (None: not checked; see ``host_budget`` for what may use it). SP sizes are those at
    which some mode runs (ulysses, dsp, usp, ring); the plan's ``sp_choice`` is the mode ``sp_mode: auto``
    takes at its sp_size and why (the same decision a run makes: ``builders.geometry.sp_auto_inputs``).
    When nothing fits, the ConfigError names the smallest device that would (``smallest_card``)."""
    pipeline_class = None
    if getattr(cfg.model, "pipeline", None):  # what the pipeline folder settles: caption tokens, clip sizes
        from ..builders.pipeline import resolve_pipeline

        cfg = copy.deepcopy(cfg)
        pipeline_class = resolve_pipeline(cfg).pipeline_class
    precision = precision or plan_precision(cfg)
    release = released_config(cfg.model.path, cfg.model.name) if config_family(cfg) == "video" else None
    if release is not None:  # a released model whose folder is not on this machine: its config's numbers
        cfg = copy.deepcopy(cfg)
        cfg.model.config, cfg.model.path, path = dict(release.config), None, cfg.model.path
    model = model_of_config(cfg)
    if release is not None and release.experts == 2:  # Wan 2.2 A14B: both experts, as a run of its folder trains
        model = NoiseExperts(model, model_of_config(cfg), boundary=0.0)
    model = adapted_model(cfg, model)
    shape = model_shape_of_config(cfg, model, precision)
    buckets = latent_buckets(cfg)
    caption = cfg.text_encoder.max_length if config_family(cfg) == "video" else 0
    pipeline_class = pipeline_class or planned_pipeline(cfg, release)
    conditioning = conditioning_of_pipeline(pipeline_class) if pipeline_class else None
    conditioned = ""
    if conditioning is not None:  # what its images add to each sample: reference tokens, vision tokens in the text
        added = {b.name: conditioning.planned_tokens(b.height, b.width) for b in buckets}
        buckets = [dataclasses.replace(b, extra_tokens=added[b.name][0]) for b in buckets]
        vision = max(text for _, text in added.values())
        caption += vision
        if any(any(a) for a in added.values()):
            conditioned = (f"each sample's reference image as {pipeline_class} sizes it: "
                           f"{', '.join(f'{added[b.name][0]} tokens ({b.name})' for b in buckets)} on the sequence "
                           f"axis" + (f", and {vision} vision tokens in its caption" if vision else ""))
    weights = WeightShape.of(model)
    if distilling(cfg) and not cfg.lora.rank:  # three copies: student and critic trained, the teacher frozen
        weights = dataclasses.replace(weights, trainable=2 * weights.trainable,
                                      outside=weights.outside + weights.trainable)
    largest = max(buckets, key=lambda b: sample_tokens(shape, b.frames, b.height, b.width, b.extra_tokens))
    costs = Costs(shape, weights, world_size, precision.element_bytes,
                  sample_tokens(shape, largest.frames, largest.height, largest.width, largest.extra_tokens),
                  speed or Speed(), tuple(buckets), caption, cfg.ema.enable)
    settings = [Setting(cfg.zero_degree, cfg.sp_size, cfg.selective_ratio, cfg.ac_offload, *memory_settings(cfg))
                ] if fixed else None

    def auto(sp_size: int):
        return sp_auto_inputs(model, cfg, sp_size, ranks_per_node)

    heads, modes = sharded_heads(model), declared_sp_modes(model)
    sp_sizes = [p for p in (1, 2, 4, 8, 16, 32) if world_size % p == 0
                and (p == 1 or mode_candidates(heads, p, modes, auto(p).workload))]
    options = memory_options(weights, world_size)
    pipeline_distill = distilling(cfg) and bool(getattr(cfg.model, "pipeline", None))
    if pipeline_distill:  # what a pipeline's distillation runs with today (training/distill_pipeline.py)
        options = (MemoryOptions(blocks_to_swap=options.blocks_to_swap, zero_degrees=(2, 1, 0)) if cfg.lora.rank else
                   MemoryOptions(zero_degrees=(2, 1, 0)))
    arguments = dict(element_bytes=precision.element_bytes, caption_tokens=caption, reserve_gib=reserve_gib,
                     min_batch=min_batch, max_batch=max_batch, settings=settings, sp_sizes=sp_sizes, options=options,
                     states=costs.states, extra_cost=costs.extra_cost,
                     host=host_budget(costs, host_gib, min(world_size, ranks_per_node)) if host_gib else None)
    try:
        result = plan(shape, buckets, memory_gib, world_size, **arguments)
    except ValueError as e:
        card = smallest_card(lambda gib: plan(shape, buckets, gib, world_size, **arguments), memory_gib)
        raise ConfigError(f"{e}{'; ' + card if card else ''}.") from None
    result.costs = costs
    if release is not None:
        result.assumptions.append(f"model.path {path!r} is not on this machine: planned with the "
                                  f"released {release.repo} transformer config (its family's record, "
                                  f"opendit_lite/families/)" + (f", {release.experts} experts of it (both trained)"
                                                                if release.experts > 1 else ""))
    if conditioned:
        result.assumptions.append(conditioned)
    result.assumptions.append(f"weights: {weights.block_linear / 1e9:.2f}B frozen linear weights in the blocks, "
                              f"{weights.trainable / 1e6:.1f}M trainable; step-time costs at batch 1 of "
                              f"{largest.name} on {costs.speed.describe()}")
    if distilling(cfg):
        networks = (f"the student's and the critic's adapters (rank {cfg.lora.rank} each) and their optimizer "
                    f"states on one frozen base" if cfg.lora.rank else
                    "three copies of the model (the teacher frozen; student and critic trained, with their "
                    "optimizer states)")
        result.assumptions.append(
            f"distillation: {networks}; each step trains one of them, so one network's activations are saved (the "
            f"teacher's two and the critic's judging forwards run without gradient)"
            + ("; a pipeline's: DDP or ZeRO-1/2, SP, block swapping of a LoRA base, its base as loaded (what it "
               "supports today)" if pipeline_distill else ""))
    sp = result.setting.sp_size
    if sp > 1:
        result.sp_choice = resolve_auto(model, sp, auto(sp))
    result.sp_requested = cfg.sp_mode
    if config_family(cfg) != "video" and not cfg.model.input_size and cfg.data.type == "latents" \
            and latent_folder_size(cfg) is None:
        result.assumptions.append(f"image latents of data.image_size / {config_downsample(cfg)} (no meta.json in "
                                  f"data.path to read their size from); model.input_size=[H,W] plans another size")
    return result, buckets, shape


def planned_pipeline(cfg, release: Optional[Release]) -> Optional[str]:
    """The pipeline class whose conditioning a plan without ``model.pipeline`` counts: the release's that
    ``model.path`` names (its record's ``pipeline``), or the ``model_index.json`` of the pipeline folder that
    holds the ``model.path`` transformer; None when neither says."""
    if release is not None:
        return release.pipeline or None
    path = getattr(cfg.model, "path", None)
    index = os.path.join(os.path.dirname(os.path.normpath(path)), "model_index.json") if path else ""
    if not os.path.isfile(index):
        return None
    with open(index) as f:
        return json.load(f).get("_class_name")


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


__all__ = ["Costs", "HostBudget", "LatentBucket", "ModelShape", "Plan", "Setting", "Speed", "WeightShape",
           "adapted_model", "family_shape", "host_budget", "latent_buckets", "memory_settings", "model_of_config",
           "model_shape_of_config", "plan", "plan_bucket_batches", "plan_config", "plan_precision"]
