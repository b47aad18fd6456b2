"""Sampling a run trained from a diffusers pipeline folder (``model.pipeline``) through that pipeline:
the family's own pipeline class, loaded from the folder (its text encoders and ``encode_prompt``, VAE,
scheduler, default guidance and negative prompt), around the run's trained weights, so that a
sample is what the user gets by calling the pipeline with the run's export loaded.

* ``load_trained_pipeline``: the pipeline with the checkpoint's weights (the EMA by default). A LoRA
  run's adapters are written as the run's export writes them (``interop.family_checkpoint``, the
  pipeline class's own ``save_lora_weights``) into a temporary folder and loaded with the pipeline's
  ``load_lora_weights`` (Wan 2.2's low-noise expert's with ``load_into_transformer_2``; a pipeline
  without it, HunyuanVideo 1.5's, with its transformer's ``load_lora_adapter``; a pipeline distillation's
  student adapter, at its step count without guidance: ``check_student_sampling``); a full
  fine-tune's transformer(s) take the checkpoint's weights. Every transformer the pipeline runs is
  then parallelized for sampling (``parallelize_from_config``: sequence parallelism over the
  sampling mesh's group, kernels, ``sample.compile``).
* ``pipeline_batches``: this rank's block of prompts in batches, each prompt's noise drawn by its own
  generator seeded by (``sample.seed``, its index), the generators the pipeline's ``generator``
  list takes: the same samples for any batch size or rank layout, and the samples of a direct
  ``pipe(prompts, generator=[...])`` call.

The ranks of one sequence-parallel group run the pipeline on the same prompts; the transformer's
tokens are split over them and gathered at its output, so every rank denoises the same latents.
"""

import inspect
import os
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from ..builders.parallelize import parallelize_from_config
from ..builders.pipeline import check_clip_size, light_pipeline, run_pipeline_folder
from ..builders.pipeline_experts import pipeline_boundary, trained_components
from ..builders.student_lora import (
    is_pipeline_distillation,
    student_guidance,
    student_lora_state,
    write_student_adapter,
)
from ..checkpoint.layout import saved_config
from ..checkpoint.weights import load_weights
from ..config import ConfigError
from ..diffusion.sampling_utils import SampleGenerators
from ..encoders.pipeline_folder import TRANSFORMERS, load_pipeline
from ..interop.diffusers_export import pipeline_loads_lora
from ..interop.family_checkpoint import write_export
from ..interop.pretrained_files import LORA_WEIGHT_NAME
from ..models.experts import NoiseExperts
from .cache.cache_settings import resolve_cache
from .pipeline_cfg_parallel import PipelineBranches, split_branches
from .sharding import SamplingRanks


def check_pipeline_sampling(cfg, given_pipeline, given_text_encoder) -> None:
    """The sampling settings of a run from a pipeline folder (``cfg.model`` the run's, adopted from its
    checkpoint): the pipeline's own scheduler, text encoders and VAE sample it, so ``sample.sampler``,
    ``vae.path`` and ``text_encoder.path`` (``given_text_encoder``: the command line's) are refused,
    the command line's ``model.pipeline`` (``given_pipeline``), when given, is the folder the run
    trained, and the size to sample is one the pipeline takes without rounding it."""
    trained = cfg.model.pipeline
    if given_pipeline and os.path.realpath(given_pipeline) != os.path.realpath(trained):
        raise ConfigError(f"the run was trained from the pipeline folder {trained!r}, but model.pipeline is "
                          f"{given_pipeline!r}: sample with the folder it trained (model.pipeline={trained}).")
    own = [key for key, value in (("sample.sampler", cfg.sample.sampler), ("vae.path", cfg.vae.path),
                                  ("text_encoder.path", given_text_encoder)) if value]
    if own:
        raise ConfigError(f"a run from model.pipeline samples through its {run_pipeline_folder(cfg).pipeline_class}, "
                          f"with that pipeline's own scheduler, VAE and text encoders: remove {', '.join(own)}.")
    if resolve_cache(cfg.sample.cache)["kind"] != "none":
        raise ConfigError(f"a run from model.pipeline samples through its {run_pipeline_folder(cfg).pipeline_class}, "
                          f"whose call runs every step itself; sample.cache applies to this library's own sampler "
                          f"only: remove it (sequence parallelism, sp_size, and sample.cfg_parallel do apply).")
    folder = run_pipeline_folder(cfg)
    distilled = folder.conditioning.guidance_free(folder.path, cfg.model.guidance_distilled)
    unguided = folder.conditioning.unguided_scale
    if distilled and cfg.sample.cfg_scale not in (None, unguided):
        raise ConfigError(f"sample.cfg_scale={cfg.sample.cfg_scale:g} sets classifier-free guidance, but the model in "
                          f"{trained!r} does not use it: {distilled}. Its {folder.pipeline_class} would run the "
                          f"unconditional branch the model was distilled to do without; remove sample.cfg_scale (it "
                          f"samples at {unguided:g}), or sample the base model's folder with guidance.")
    if cfg.sample.cfg_parallel:
        check_pipeline_cfg_parallel(folder, cfg.sample.cfg_scale, cfg.model.guidance_distilled)
    pipeline_call_settings(cfg)  # the sizes, checked before anything is loaded
    sample_images(cfg, None)


def check_pipeline_cfg_parallel(folder, cfg_scale: Optional[float], distilled: Optional[bool] = None) -> None:
    """A ConfigError unless CFG-parallel ranks can each run one guidance branch of ``folder``'s pipeline at
    ``cfg_scale`` (``pipeline_cfg_parallel.py``): a model that guides by classifier-free guidance (not
    distilled from it: ``distilled``, ``model.guidance_distilled``, or the family's released folders), whose
    family declares how its pipeline runs the two branches, at a scale given and at which it runs both."""
    c = folder.conditioning
    if c.guided(folder.transformer_config()):
        why = "embeds the guidance scale as an input (guidance-distilled): its pipeline runs no unconditional branch"
    elif c.guidance_free(folder.path, distilled):
        why = c.guidance_free(folder.path, distilled)
    elif c.cfg_branches is None:
        why = (f"is sampled by {folder.pipeline_class}, whose family does not declare how it runs guidance's two "
               f"branches (its conditioning's cfg_branches), so they cannot be split over ranks")
    else:
        why = ""
    if why:
        raise ConfigError(f"sample.cfg_parallel runs classifier-free guidance's conditional and unconditional branches "
                          f"on two groups of ranks, but the model in {folder.path!r} {why}. Set "
                          f"sample.cfg_parallel=false and use the ranks for data or sequence parallelism (sp_size).")
    if cfg_scale is None:
        raise ConfigError(f"sample.cfg_parallel splits the guidance branches of {folder.pipeline_class}: give the "
                          f"scale they are combined at, sample.cfg_scale (the pipeline guides when it is above "
                          f"{c.unguided_scale:g}).")
    if not c.runs_unconditional(cfg_scale):
        raise ConfigError(f"sample.cfg_parallel with sample.cfg_scale={cfg_scale:g}: {folder.pipeline_class} runs no "
                          f"unconditional branch at that scale, so half of the ranks would have nothing to compute. "
                          f"Set sample.cfg_parallel=false, or a cfg_scale above {c.unguided_scale:g}.")


def check_student_sampling(cfg, saved: dict) -> None:
    """A pipeline distillation's checkpoint samples its student as the pipeline runs it: at the student's
    step count, without classifier-free guidance (``sample.cfg_scale`` set to the pipeline's off value, or
    a guidance-embedded transformer's trained value: ``student_guidance``)."""
    d, s = saved["distill"], cfg.sample
    steps, guidance = d["student_timesteps"], student_guidance(cfg)
    if s.num_sampling_steps != steps:
        raise ConfigError(f"this checkpoint's student was distilled to {steps} steps of its pipeline's scheduler "
                          f"(distill.student_timesteps), but sample.num_sampling_steps={s.num_sampling_steps}: it "
                          f"is trained only at the times of {steps} steps; set sample.num_sampling_steps={steps}.")
    if s.cfg_scale not in (None, guidance):
        raise ConfigError(f"sample.cfg_scale={s.cfg_scale:g}: the student learned the teacher's guided samples "
                          f"(distill.guidance_scale={d.get('guidance_scale')}) and samples without classifier-free "
                          f"guidance; remove sample.cfg_scale (it samples at {guidance:g}).")
    s.cfg_scale = guidance


def sample_images(cfg, count: Optional[int]) -> Optional[List[List[str]]]:
    """``sample.images`` as one list of files per prompt (None: a text-only pipeline), checked against the
    run's pipeline: required for an image-conditioned one, refused for a text-only one, one entry per
    prompt (``count``; None: not checked yet), at most the images the pipeline takes, existing files."""
    folder = run_pipeline_folder(cfg)
    c, given = folder.conditioning, cfg.sample.images
    if c.image_input == "none":
        if given:
            raise ConfigError(f"sample.images gives conditioning images, but {folder.pipeline_class} is a text-only "
                              f"pipeline and would ignore them: remove sample.images.")
        return None
    if not given:
        what = {"first_frame": "the first frame of each video", "first_last_frames": "the first and the last frame "
                "of each video, 'first.png|last.png'"}.get(c.image_input, "the image each prompt edits")
        raise ConfigError(f"the run trained {folder.pipeline_class}, which is conditioned on an image ({what}): give "
                          f"sample.images, one image file per prompt in the order of the prompts (several for one "
                          f"prompt separated by '|').")
    images = [[p.strip() for p in entry.split("|") if p.strip()] for entry in given]
    if count is not None and len(images) != count:
        raise ConfigError(f"sample.images gives {len(images)} entries for {count} prompts: give one per prompt, in "
                          f"the order of the prompts.")
    most = max(1, c.max_images)
    for i, paths in enumerate(images):
        exact = c.image_input == "first_last_frames"  # both frames given
        if not paths or len(paths) > most or (exact and len(paths) != most):
            takes = f"{most} ('first.png|last.png')" if exact else f"1{f' to {most}' if most > 1 else ''}"
            raise ConfigError(f"sample.images entry {i} names {len(paths)} images; {folder.pipeline_class} takes "
                              f"{takes} per prompt.")
        for path in paths:
            if not os.path.isfile(path):
                raise ConfigError(f"sample.images entry {i}: {path!r} does not exist.")
    return images


def _open_images(paths: List[str]) -> list:
    from PIL import Image, UnidentifiedImageError

    opened = []
    for path in paths:
        try:
            with Image.open(path) as im:
                opened.append(im.convert("RGB"))
        except (OSError, UnidentifiedImageError, SyntaxError) as e:
            raise ConfigError(f"sample.images: {path!r} cannot be decoded as an image ({type(e).__name__}: {e}): "
                              f"give an image file.") from None
    return opened


def load_trained_pipeline(cfg, ckpt: str, ranks: SamplingRanks):
    """``cfg.model.pipeline``'s pipeline on ``ranks.device`` with ``ckpt``'s trained weights
    (``sample.use_ema``), its transformers parallelized for sampling (module docstring)."""
    folder = run_pipeline_folder(cfg)
    pipe = load_pipeline(folder.path, device=ranks.device, skip=(), pipeline_class=folder.pipeline_class)
    if folder.family.encoding.one_clip_at_a_time:  # its VAE fails on a batch (HunyuanVideo 1.5's): one clip at a time
        pipe.vae.enable_slicing()
    saved = saved_config(ckpt)
    lora, trained = saved.get("lora"), trained_components(cfg)
    if lora and lora.get("rank"):
        with tempfile.TemporaryDirectory(prefix="opendit_lora_") as tmp:
            if is_pipeline_distillation(saved):  # the student's adapter (the critic's is not sampled)
                write_student_adapter(saved["model"], lora, ckpt, tmp, use_ema=cfg.sample.use_ema)
            else:
                write_export(saved["model"], lora, ckpt, tmp, use_ema=cfg.sample.use_ema, lora_mode="adapter")
            for component in trained:
                if component == "transformer" and not pipeline_loads_lora(folder.pipeline_class):
                    pipe.transformer.load_lora_adapter(tmp, weight_name=LORA_WEIGHT_NAME)
                elif component == "transformer":
                    pipe.load_lora_weights(tmp)
                else:
                    pipe.load_lora_weights(os.path.join(tmp, component), load_into_transformer_2=True)
    elif is_pipeline_distillation(saved):  # a full-weight student
        pipe.transformer.load_state_dict(student_lora_state(ckpt, 0, use_ema=cfg.sample.use_ema))
    elif len(trained) == 2:  # Wan 2.2's two experts, one module in the checkpoint
        load_weights(NoiseExperts(pipe.transformer, pipe.transformer_2, pipeline_boundary(folder.path)), ckpt,
                     use_ema=cfg.sample.use_ema)
    else:
        load_weights(getattr(pipe, trained[0]), ckpt, use_ema=cfg.sample.use_ema)
    for name in TRANSFORMERS:
        model = getattr(pipe, name, None)
        if model is not None:
            report = parallelize_from_config(model, cfg, ranks.sp_group, sampling=True)
            if ranks.is_main and (ranks.sp_size > 1 or cfg.sample.compile):
                print(f"{name}: {report}")
            model.eval()
    pipe.set_progress_bar_config(disable=not ranks.is_main)
    return pipe


def pipeline_call_settings(cfg) -> Dict[str, Any]:
    """The keywords every call of the pipeline takes: the sampling steps, the clip size
    (``sample.num_frames/height/width``, else the trained ``data.num_frames/image_size``, else the
    pipeline's default), and ``guidance_scale`` when ``sample.cfg_scale`` (or, for a guidance-distilled
    model, the trained ``model.guidance``) sets one; for a model distilled from classifier-free guidance
    (``guidance_free``, Z-Image-Turbo) the scale that runs no unconditional branch; otherwise the
    pipeline's own default guidance; and what the conditioning adds to render that size (``call_size``:
    Flux Kontext's ``max_area``)."""
    folder = run_pipeline_folder(cfg)
    family, s, d = folder.family, cfg.sample, cfg.data
    image_only = family.adapter.image_only
    if image_only and s.num_frames not in (None, 1):
        raise ConfigError(f"{family.class_name} is an image model: remove sample.num_frames (it samples images).")
    frames = None if image_only else (s.num_frames or d.num_frames)
    height, width = s.height or d.image_size, s.width or d.image_size
    light = light_pipeline(folder.path, folder.pipeline_class)
    check_clip_size(folder, light, frames, height, width, "sample.num_frames/height/width ask for")
    terminal = getattr(light.scheduler, "config", {}).get("shift_terminal")
    if terminal and s.num_sampling_steps == 1:
        # FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal divides 1 - sigma by its last value: 0 at one step
        raise ConfigError(f"sample.num_sampling_steps=1, but the scheduler of {folder.pipeline_class} in "
                          f"{folder.path!r} stretches its schedule to end at shift_terminal={terminal:g}, which "
                          f"divides by zero with a single step (the pipeline called directly gives NaN or fails). "
                          f"Sample with sample.num_sampling_steps=2 or more.")
    settings: Dict[str, Any] = dict(num_inference_steps=s.num_sampling_steps)
    settings.update({k: v for k, v in (("num_frames", frames), ("height", height), ("width", width)) if v})
    if height and width:
        settings.update(folder.conditioning.call_size(height, width))
    guided = folder.conditioning.guided(folder.transformer_config())
    guidance = s.cfg_scale if s.cfg_scale is not None else (cfg.model.guidance if guided else None)
    if guidance is None and folder.conditioning.guidance_free(folder.path, cfg.model.guidance_distilled):
        # distilled from classifier-free guidance: the scale that runs no unconditional branch
        guidance = folder.conditioning.unguided_scale
    if guidance is not None:
        settings.update(folder.conditioning.guidance_call(guidance, guided))
    return settings


@torch.no_grad()
def pipeline_batches(pipe, cfg, prompts: List[str], ranks: SamplingRanks) -> Iterator[Tuple[range, torch.Tensor]]:
    """This rank's block of ``prompts`` in batches of ``sample.batch_size``: yields (global indices,
    clips [b, 3, T, H, W] in [-1, 1] on the CPU; images are 1-frame clips), the pipeline's output."""
    settings = call_keywords(pipe, cfg, pipeline_call_settings(cfg))
    images = sample_images(cfg, len(prompts))
    branches = pipeline_branches(cfg, ranks)
    if images is not None:  # one call per prompt with its images: image-conditioned pipelines batch them unevenly
        conditioning = run_pipeline_folder(cfg).conditioning
        for indices in ranks.batches(len(prompts), 1):
            generators = SampleGenerators(cfg.sample.seed, indices).generators
            i = indices[0]
            # the prompt by keyword: an image-to-video pipeline's __call__ takes the image first
            with split_branches(pipe, TRANSFORMERS, branches, 1):
                out = pipe(prompt=prompts[i], generator=generators, output_type="pt", **settings,
                           **conditioning.call_images(_open_images(images[i])))
            yield indices, pipeline_pixels(out).float().cpu()
        return
    for indices in ranks.batches(len(prompts), cfg.sample.batch_size):
        generators = SampleGenerators(cfg.sample.seed, indices).generators  # prompt i's noise: (seed, i)
        # the prompts by keyword: a pipeline's first parameter may be a conditioning image
        with split_branches(pipe, TRANSFORMERS, branches, len(indices)):
            out = pipe(prompt=[prompts[i] for i in indices], generator=generators, output_type="pt", **settings)
        yield indices, pipeline_pixels(out).float().cpu()


def pipeline_branches(cfg, ranks: SamplingRanks) -> Optional[PipelineBranches]:
    """With CFG-parallel ranks, what splits the pipeline's guidance branches between this rank and its twin
    (its family's ``cfg_branches``); else None."""
    if ranks.cfg_size == 1:
        return None
    mode = run_pipeline_folder(cfg).conditioning.cfg_branches
    return PipelineBranches(mode, ranks.cfg_group, ranks.cfg_rank)


def call_keywords(pipe, cfg, settings: Dict[str, Any]) -> Dict[str, Any]:
    """``settings`` as ``pipe.__call__`` takes them. A pipeline whose call takes no ``guidance_scale`` but
    holds a ``guider`` (HunyuanVideo 1.5's) gets the scale on a copy of its guider; one that takes no
    ``height`` / ``width`` (HunyuanVideo 1.5's image-to-video: its image sets the clip's size) is called
    without the trained size, and an explicit ``sample.height`` / ``sample.width`` is refused."""
    params = inspect.signature(type(pipe).__call__).parameters
    settings = dict(settings)
    if "guidance_scale" in settings and "guidance_scale" not in params:
        if getattr(pipe, "guider", None) is None:
            raise ConfigError(f"{type(pipe).__name__} takes no guidance scale: remove sample.cfg_scale.")
        pipe.guider = pipe.guider.new(guidance_scale=settings.pop("guidance_scale"))
    sizes = [k for k in ("height", "width") if k in settings and k not in params]
    if sizes and (cfg.sample.height or cfg.sample.width):
        raise ConfigError(f"{type(pipe).__name__} sizes the clip by its image (it takes no height or width): "
                          f"remove sample.height and sample.width.")
    for key in sizes:
        del settings[key]
    return settings


def pipeline_pixels(output) -> torch.Tensor:
    """A pipeline's ``output_type="pt"`` output -> clips [B, 3, T, H, W] in [-1, 1]: a video pipeline's
    ``frames`` [B, T, 3, H, W] or an image pipeline's ``images`` [B, 3, H, W], both in [0, 1]."""
    if hasattr(output, "frames"):
        return output.frames.permute(0, 2, 1, 3, 4) * 2 - 1  # [B, 3, T, H, W]
    return output.images.unsqueeze(2) * 2 - 1                # [B, 3, 1, H, W]
