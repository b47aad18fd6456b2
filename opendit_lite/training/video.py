"""The video trainer's declarations (``VIDEO_TRAINER``), which train_video.py runs with the shared
loop: the cross-section checks of the video schema, the data (built by ``opendit_lite.builders.video``)
and how one loader batch becomes the model's input; ``bucket_batch: auto`` sizes the buckets with
the planner here, above the builders.
"""

import os
from typing import Optional

from ..builders.diffusers_model import (
    check_family_inputs,
    diffusers_config,
    family_denoiser,
    family_recipe,
    is_family,
    resolve_family_text,
)
from ..builders.family import check_model_family
from ..builders.objective import build_training_objective
from ..builders.pipeline import resolve_pipeline
from ..builders.pipeline_experts import expert_objective_range, resolve_expert
from ..builders.video import (
    CaptionEncoder,
    bucket_loss_weights,
    build_bucket_sampler,
    build_video_dataset,
    build_video_model,
    check_bucket_shapes,
    check_latents_without_pipeline,
    load_caption_encoder,
    load_video_vae,
    model_clip_shape,
    model_patch_size,
    resolve_video_geometry,
    video_buckets,
)
from ..config import to_dict
from ..config.video_schema import VideoTrainConfig
from ..data.buckets import BucketBatchSampler
from ..data.media_folders import MEDIA_DATA_TYPES
from ..distributed.ranks import global_rank
from ..encoders.video_vae import VideoVAE
from ..errors import ConfigError
from ..families import family_adapter, family_of
from ..interop.comfyui_lora import COMFYUI_WEIGHT_NAME
from ..interop.diffusers_export import pipeline_loads_lora
from ..interop.family_checkpoint import check_lora_format, default_lora_format, export_family_checkpoint
from ..interop.pretrained_files import LORA_WEIGHT_NAME
from ..parallel.modes import ulysses_heads_error
from ..precision import Precision
from .periodic_samples import check_periodic_sampling, periodic_sampling
from .pipeline_data import prepare_pipeline_data
from .spec import TrainerSpec, TrainingData


def validate_video_config(cfg) -> None:
    """Cross-section checks of the video schema (the loader checks each field on its own); a run from a
    pipeline folder first takes what the folder settles (``builders.pipeline.resolve_pipeline``)."""
    if cfg.model.pipeline_class and not cfg.model.pipeline:
        raise ConfigError(f"model.pipeline_class={cfg.model.pipeline_class} names the class to load model.pipeline's "
                          f"folder as, but model.pipeline is not set: give the pipeline folder, or remove "
                          f"model.pipeline_class.")
    if cfg.model.pipeline:
        resolve_pipeline(cfg)
    resolve_expert(cfg)  # Wan 2.2's two experts: model.expert filled, so the saved config says what trains
    kind = cfg.text_encoder.kind
    if cfg.data.type == "shapes" and kind != "shapes":
        raise ConfigError(f"data.type=shapes carries its own word-vector caption states, so text_encoder.kind must "
                          f"be 'shapes' (got {kind!r}); use data.type=csv to train with a {kind} encoder.")
    m = cfg.model
    if not is_family(m.name):
        check_model_family(m.name, "video")  # an unknown name lists the zoo's and the diffusers classes
    if not is_family(m.name) and (m.path or m.config):
        raise ConfigError(f"'model.path' and 'model.config' are for the diffusers classes; {m.name} is a model of the "
                          f"zoo (built from model.name and the data): remove them.")
    if not is_family(m.name) and m.guidance is not None:
        raise ConfigError(f"model.guidance sets a diffusers pipeline's guidance embedding; {m.name} has none: remove "
                          f"it.")
    if not is_family(m.name) and m.guidance_distilled is not None:
        raise ConfigError(f"model.guidance_distilled declares how a diffusers pipeline folder's model samples; "
                          f"{m.name} is a model of the zoo: remove it.")
    if is_family(m.name) and not m.pipeline:
        check_family_without_pipeline(cfg)
    if cfg.data.type == "latents" and not m.pipeline:
        check_latents_without_pipeline(cfg.data.path)
    if is_family(m.name):  # model.path / model.config and the heads checked before anything starts
        heads = family_adapter(m.name).attention_heads(diffusers_config(cfg))
        if cfg.sp_size > 1 and cfg.sp_mode == "ulysses" and heads % cfg.sp_size:
            raise ulysses_heads_error(heads, cfg.sp_size, f"{m.name}'s attention")
    check_export(cfg)
    check_periodic_sampling(cfg)
    d = cfg.diffusion
    if not is_family(m.name):  # the zoo's video models: rectified flow with logit-normal times unless set
        d.objective = d.objective or "rflow"
        d.timestep_sampling = d.timestep_sampling or "logit-normal"


def check_family_without_pipeline(cfg) -> None:
    """A diffusers family without ``model.pipeline`` (a random init, or ``model.path``) trains on the
    embedded data, pixels or precomputed latents: encoding clips or captions for it takes its pipeline's
    own VAE, text encoders and conditioning, which only ``model.pipeline`` gives (a model whose
    conditioning needs more than a clip batch, an image-to-video transformer, is refused here:
    ``needs_pipeline``)."""
    m = cfg.model
    why = family_adapter(m.name).needs_pipeline(diffusers_config(cfg))
    if why:
        raise ConfigError(why)
    if cfg.vae.path:
        raise ConfigError(f"vae.path encodes clips frame by frame with an image AutoencoderKL scaled by "
                          f"vae.scale_factor, which is not how {m.name}'s pipeline encodes them: set model.pipeline to "
                          f"the pipeline folder (its VAE and normalisation are used) and remove vae.path and "
                          f"model.path.")
    if m.guidance is not None:
        raise ConfigError("model.guidance sets the guidance value a pipeline's transformer is trained with: it needs "
                          "model.pipeline.")
    if m.guidance_distilled is not None:
        raise ConfigError("model.guidance_distilled declares how a pipeline folder's model samples (through that "
                          "pipeline): it needs model.pipeline.")


def exports_diffusers(cfg) -> bool:
    """Whether the run ends by writing ``<run dir>/diffusers/`` (export.diffusers; null: a family)."""
    return is_family(cfg.model.name) if cfg.export.diffusers is None else cfg.export.diffusers


def check_export(cfg) -> None:
    """The export section fits the model and the run (before anything starts)."""
    e, name = cfg.export, cfg.model.name
    if e.diffusers and not is_family(name):
        raise ConfigError(f"export.diffusers=true writes a diffusers family's transformer, but {name} is a model of "
                          f"the zoo, which has no diffusers class: remove export.diffusers.")
    if not exports_diffusers(cfg) and (e.lora is not None or not e.ema):
        raise ConfigError("export.lora and export.ema shape the diffusers export, which this run does not write "
                          "(export.diffusers is off): remove them, or set export.diffusers=true.")
    if exports_diffusers(cfg) and e.lora is not None and not cfg.lora.rank:
        raise ConfigError(f"export.lora={e.lora} says how a LoRA run exports its adapters, but this run trains every "
                          f"weight (lora.rank=0) and exports the whole model: remove export.lora, or set lora.rank.")
    if e.lora_format is not None and (not exports_diffusers(cfg) or export_lora_mode(cfg) != "adapter"):
        raise ConfigError(f"export.lora_format={e.lora_format} names the files of a LoRA run's adapters, but this run "
                          f"writes no adapter file (it needs lora.rank > 0, export.lora adapter and the diffusers "
                          f"export on): remove export.lora_format.")
    if e.lora_format is not None:
        check_lora_format(name, e.lora_format)  # comfyui / both: the family has an original layout


def export_lora_format(cfg) -> str:
    """The adapter file(s) of a LoRA run's export: ``export.lora_format``; null: both formats for a family
    that declares an original checkpoint layout, the diffusers format otherwise."""
    return cfg.export.lora_format or default_lora_format(cfg.model.name)


def export_lora_mode(cfg) -> str:
    """How the run exports: a LoRA run's ``export.lora`` (null: the adapters alone); "merged" (the whole
    model) otherwise."""
    return (cfg.export.lora or "adapter") if cfg.lora.rank else "merged"


def export_at_end(cfg, checkpoint: str, run_dir: str) -> None:
    """``<run dir>/diffusers/``: the final checkpoint as the family's pipeline loads it (every rank calls;
    rank 0 writes; the layouts: ``interop.family_checkpoint``)."""
    if not exports_diffusers(cfg):
        return
    mode = export_lora_mode(cfg)
    out = export_family_checkpoint(to_dict(cfg.model), to_dict(cfg.lora), checkpoint,
                                   os.path.join(run_dir, "diffusers"), use_ema=cfg.export.ema and cfg.ema.enable,
                                   lora_mode=mode, lora_format=export_lora_format(cfg))
    if global_rank() == 0:
        weights = "EMA" if cfg.export.ema and cfg.ema.enable else "trained"
        print(f"wrote {export_description(cfg, mode, out)} ({weights} weights)")


def export_description(cfg, mode: str, out: str) -> str:
    """What the export at ``out`` holds and how to load it, for the end-of-run line."""
    m = cfg.model
    source = repr(m.pipeline) if m.pipeline else "<its pipeline>"
    if mode == "adapter":
        first = f"pipe.load_lora_weights({out!r})"
        family = family_of(m.name)
        if family is not None and not pipeline_loads_lora(family.pipeline):  # its transformer loads the file
            first = f"pipe.transformer.load_lora_adapter({out!r}, weight_name={LORA_WEIGHT_NAME!r})"
        loads = [] if m.expert == "low_noise" else [first]
        if m.expert in ("both", "low_noise"):  # the low-noise expert's adapters go to transformer_2
            loads.append(f"pipe.load_lora_weights({os.path.join(out, 'transformer_2')!r}, "
                         f"load_into_transformer_2=True)")
        text = f"the LoRA adapters to {out}: pipe = DiffusionPipeline.from_pretrained({source}); " + "; ".join(loads)
        if export_lora_format(cfg) == "comfyui":
            return f"the LoRA adapters to {os.path.join(out, COMFYUI_WEIGHT_NAME)} (ComfyUI's LoRA loader)"
        if export_lora_format(cfg) == "both":
            text += f"; for ComfyUI: {COMFYUI_WEIGHT_NAME} beside it"
        return text
    if m.pipeline:
        return f"the fine-tuned pipeline to {out}: DiffusionPipeline.from_pretrained({out!r})"
    return f"the diffusers {m.name} to {out}: {m.name}.from_pretrained({out!r})"


def resolve_family_objective(cfg) -> None:
    """A diffusers family's published recipe for the ``diffusion`` fields left null (after the clip
    shape is resolved: Flux and LTX-Video shift by the token count)."""
    d, recipe = cfg.diffusion, family_recipe(cfg)
    d.objective = d.objective or recipe.objective
    d.timestep_sampling = d.timestep_sampling or recipe.timestep_sampling
    d.shift = recipe.shift if d.shift is None else d.shift


def batch_to_inputs(batch, captions: Optional[CaptionEncoder], vae: Optional[VideoVAE], device):
    """A loader batch of any video dataset -> (x [B, C, T, H, W], states [B, M, Cy], mask [B, M]).

    ``vae`` encodes pixel clips into latents; pass None for pixel-space training and precomputed latents."""
    if len(batch) == 4:  # shapes / latents: (clips, states, mask, captions)
        x, states, mask, _ = batch
        states, mask = states.to(device, non_blocking=True), mask.to(device, non_blocking=True)
    else:  # csv: (clips, captions)
        x, text = batch
        states, mask = captions.encode(text, device)
    x = x.to(device, non_blocking=True)
    if vae is not None:
        x = vae.encode(x)
    return x, states, mask


def prepare_video_data(cfg, device, sp_group=None) -> TrainingData:
    if cfg.model.pipeline:
        return prepare_pipeline_data(cfg, device, sp_group)
    buckets = video_buckets(cfg)
    family = is_family(cfg.model.name)
    if family:  # the caption width is the model's: the shapes data draws its word vectors at it
        resolve_family_text(cfg)
    dataset = build_video_dataset(cfg, buckets)
    # CSV captions are encoded while training; shapes and latents carry their states.
    captions = load_caption_encoder(cfg, device) if cfg.data.type in MEDIA_DATA_TYPES else None
    vae = load_video_vae(cfg, device, sp_group=sp_group) if cfg.data.type != "latents" else None
    resolve_video_geometry(cfg, dataset, vae, captions.width if captions else None, buckets)
    if family:
        given = captions.width if captions else dataset[0][1].shape[-1] if cfg.data.type == "latents" else None
        check_family_inputs(cfg, buckets, given)
        resolve_family_objective(cfg)

    def model_inputs(batch):
        x, states, mask = batch_to_inputs(batch, captions, vae, device)  # x [B, C, T, H, W]
        return x, dict(y=states, mask=mask)

    if not buckets:
        return TrainingData(dataset, model_inputs)

    def batch_sampler(model, dp_rank: int, dp_size: int, world_size: int, log,
                      precision: Precision) -> BucketBatchSampler:
        check_bucket_shapes(buckets, model_patch_size(cfg, model), vae.downsample if vae is not None else 1)
        return sized_bucket_sampler(cfg, buckets, dataset, dp_rank, dp_size, world_size, log, precision)

    # Each sample's loss is the mean over its elements, so a clip and an image count alike; a
    # bucket's loss_weight scales its samples (a batch holds one bucket, of one pixel shape).
    weights = bucket_loss_weights(buckets)
    return TrainingData(dataset, model_inputs, batch_sampler=batch_sampler,
                        loss_weight=lambda batch: weights[tuple(batch[0].shape[2:])])


def sized_bucket_sampler(cfg, buckets, dataset, dp_rank: int, dp_size: int, world_size: int, log,
                         precision: Precision) -> BucketBatchSampler:
    """The data-parallel rank's bucket sampler, its batch sizes planned for ``bucket_batch: auto``; its
    description goes to the log."""
    if cfg.bucket_batch == "auto":
        from ..plan import plan_bucket_batches

        buckets = plan_bucket_batches(cfg, buckets, world_size, precision, log)
    sampler = build_bucket_sampler(buckets, dataset, dp_rank, dp_size, cfg.global_seed)
    log.write(sampler.describe())
    return sampler


def describe_video_input(cfg) -> str:
    C, T, H, W = model_clip_shape(cfg)
    return f"clips {C}x{T}x{H}x{W}, captions {cfg.text_encoder.max_length}x{cfg.model.caption_channels}"


def video_objective(cfg):
    """The training objective; one expert of Wan 2.2's pair trains on its own noise range only."""
    return build_training_objective(cfg, time_range=expert_objective_range(cfg))


def video_denoiser(cfg, model, call):
    """What the objective calls: a diffusers family's model through its adapter, else ``call``."""
    return family_denoiser(cfg, model, call) if is_family(cfg.model.name) else call


VIDEO_TRAINER = TrainerSpec(name="video", schema=VideoTrainConfig, prepare_data=prepare_video_data,
                            build_model=build_video_model, describe=describe_video_input,
                            validate=validate_video_config, denoiser=video_denoiser, finish=export_at_end,
                            objective=video_objective, sampler=periodic_sampling)
