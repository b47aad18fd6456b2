"""Config -> a run from a diffusers pipeline folder (``model.pipeline``): the folder's checks and what it
settles in the config, its encoders, and the pieces a training step needs to feed the transformer what
the pipeline feeds it (the family's ``conditioning``, ``families/<family>/conditioning.py``).

``resolve_pipeline(cfg)`` (before anything starts) reads the folder: the family from its pipeline class
and transformer, ``model.name`` (given: it must be that transformer's class), the caption tokens
(``text_encoder.kind: pipeline``, ``max_length`` the tokens its pipeline gives the transformer), the
clip sizes (image models: 1 frame; video: ``frame_ratio x n + 1`` frames, e.g. Wan's 4n + 1; sides
that split into whole latent patches), and refuses what would train on conditions the pipeline never
produces (another text encoder, another VAE, the embedded shapes data, a guidance value for a model
without a guidance embedding, latents extracted from another pipeline or at other sizes). A folder of
two experts (Wan 2.2 A14B's ``transformer_2``) trains both, or the one ``model.expert`` names
(``builders/pipeline_experts.py``).

``PipelineEncoders`` turn a clip batch into what training from the CSV route and
``scripts/extract_latents.py --pipeline`` (the latents route) both store and train on: the latents of
the pipeline's VAE, normalised as its ``__call__`` expects them before decoding (the posterior mean),
and the per-sample text inputs of its ``encode_prompt``.
"""

import functools
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..data.media_folders import IMAGE_EXTENSIONS, MEDIA_DATA_TYPES
from ..data.video_latents import PIPELINE_FORMAT, video_latent_meta
from ..encoders.family_encoders import encode_family_latents
from ..encoders.pipeline_folder import (
    TRANSFORMERS,
    components,
    load_pipeline,
    pipeline_fingerprint,
    read_pipeline_index,
)
from ..errors import ConfigError
from ..families import FAMILIES, Family, Recipe, family_of, family_of_pipeline
from ..families.conditioning_base import PipelineConditioning, null_text_key
from ..families.pipeline_denoiser import PipelineDenoiser


@dataclass(frozen=True)
class PipelineFolder:
    """What a pipeline folder holds: its model index, family, transformer class and experts
    (``transformer``, and Wan 2.2 A14B's ``transformer_2``), and the pipeline class it is loaded as:
    the index's, or one of its family's other pipelines (``model.pipeline_class``)."""

    path: str
    index: Dict[str, Any]
    family: Family
    experts: Tuple[str, ...]
    loaded_as: Optional[str] = None  # model.pipeline_class; None: the index's class

    @property
    def pipeline_class(self) -> str:
        """The pipeline class the run loads, trains and samples the folder as."""
        return self.loaded_as or self.index["_class_name"]

    @property
    def conditioning(self) -> PipelineConditioning:
        """What the folder's pipeline class feeds the transformer it holds (the family's own pipeline or a
        variant, for that transformer's layout: ``for_model``)."""
        return self.family.conditioning_of(self.pipeline_class).for_model(self.transformer_config())

    def transformer_folder(self, expert: str = "transformer") -> str:
        return os.path.join(self.path, expert)

    def transformer_config(self, expert: str = "transformer") -> Dict[str, Any]:
        with open(os.path.join(self.transformer_folder(expert), "config.json")) as f:
            return json.load(f)


def pipeline_folder(path: str, what: str = "'model.pipeline'", pipeline_class: Optional[str] = None) -> PipelineFolder:
    """The pipeline folder ``path``, checked (``read_pipeline_index``) and matched to its family;
    ``pipeline_class`` (``model.pipeline_class``): the class to load it as, one of that family's
    pipelines (``Family.pipelines``: the released TI2V-5B folder is a WanPipeline whose image-to-video
    is WanImageToVideoPipeline), anything else a ConfigError naming them."""
    index = read_pipeline_index(path, what)
    try:
        with open(os.path.join(path, "transformer", "config.json")) as f:
            transformer = json.load(f).get("_class_name")
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {path!r}: its transformer/config.json cannot be read ({e}); copy the whole "
                          f"pipeline folder.") from None
    family = family_of_pipeline(index["_class_name"])
    if family is None:
        by_model = family_of(transformer)
        trained = ", ".join(v.pipeline for f in FAMILIES.values() for v in f.pipelines)
        if by_model is not None:
            raise ConfigError(f"{what} {path!r} is a {index['_class_name']}; the {by_model.name} family trains "
                              f"{transformer} as {by_model.pipeline} conditions it: give "
                              f"that pipeline's folder.")
        raise ConfigError(f"{what} {path!r} is a {index['_class_name']} (transformer {transformer}), which no family "
                          f"trains; the pipelines trained today are: {trained}.")
    if transformer != family.class_name:
        raise ConfigError(f"{what} {path!r} is a {index['_class_name']} whose transformer/ holds a {transformer}, "
                          f"not the {family.class_name} that pipeline runs.")
    experts = tuple(name for name in TRANSFORMERS if name in components(index))
    allowed = [v.pipeline for v in family.pipelines]
    if pipeline_class is not None and pipeline_class not in allowed:
        raise ConfigError(f"model.pipeline_class={pipeline_class} cannot load {path!r}, a {index['_class_name']} of "
                          f"the {family.name} family ({family.class_name}): it loads as one of that family's "
                          f"pipelines, {', '.join(allowed)}; set model.pipeline_class to one of them, or remove it "
                          f"(the folder's own class).")
    return PipelineFolder(path, index, family, experts,
                          None if pipeline_class == index["_class_name"] else pipeline_class)


def run_pipeline_folder(cfg) -> PipelineFolder:
    """The pipeline folder of a run's config: ``model.pipeline`` loaded as ``model.pipeline_class``."""
    return pipeline_folder(cfg.model.pipeline, pipeline_class=getattr(cfg.model, "pipeline_class", None))


def light_pipeline(path: str, pipeline_class: Optional[str] = None):
    """The pipeline of ``path`` (as ``pipeline_class``; None: its own class) with no text encoders, no
    transformers and its VAE on the meta device: its scale factors, ``__call__`` defaults and scheduler,
    at the cost of reading configs; one per folder and class (the folder's own class named or not)."""
    return _light_pipeline(path, pipeline_class or read_pipeline_index(path)["_class_name"])


@functools.lru_cache(maxsize=8)
def _light_pipeline(path: str, pipeline_class: str):
    return load_pipeline(path, text=False, meta_vae=True, pipeline_class=pipeline_class)


# --------------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------------

def resolve_pipeline(cfg) -> PipelineFolder:
    """Check ``model.pipeline`` against the rest of the config and fill what it settles, in place
    (module docstring); returns the folder."""
    m, t, d = cfg.model, cfg.text_encoder, cfg.data
    folder = run_pipeline_folder(cfg)
    family, conditioning = folder.family, folder.conditioning
    if m.name not in (None, family.class_name):
        raise ConfigError(f"'model.pipeline' {m.pipeline!r} is a {folder.pipeline_class} of the {family.name} family "
                          f"({family.class_name}), but model.name is {m.name}: remove model.name (it is read from the "
                          f"pipeline), or give a pipeline of {m.name}.")
    if m.path or m.config:
        raise ConfigError("'model.pipeline' gives the transformer (its transformer/ folder): remove model.path and "
                          "model.config.")
    pipe = light_pipeline(folder.path, folder.pipeline_class)
    tokens = conditioning.text_tokens(pipe)
    if t.kind not in (None, "pipeline") or t.path:
        raise ConfigError(f"'model.pipeline' encodes captions with the pipeline's own text encoders, as "
                          f"{folder.pipeline_class} does; text_encoder.kind={t.kind!r}"
                          f"{f' / text_encoder.path={t.path!r}' if t.path else ''} would train on states that "
                          f"pipeline never produces: remove text_encoder.kind and text_encoder.path.")
    if t.max_length not in (None, tokens):
        raise ConfigError(f"{folder.pipeline_class} gives its transformer {tokens} caption tokens, but "
                          f"text_encoder.max_length={t.max_length}: remove text_encoder.max_length (it is read from "
                          f"the pipeline).")
    if cfg.vae.path:
        raise ConfigError(f"'model.pipeline' encodes clips with the pipeline's own VAE (its vae/ folder, normalised as "
                          f"{folder.pipeline_class} decodes them): remove vae.path.")
    if cfg.encoder.fsdp:
        raise ConfigError("encoder.fsdp shards a text_encoder.path encoder over the ranks; the pipeline's own text "
                          "encoders run whole on every rank: remove encoder.fsdp (to encode once instead, extract "
                          "the latents with scripts/extract_latents.py --pipeline and train on data.type=latents).")
    if d.type == "shapes":
        raise ConfigError("'model.pipeline' trains on your captioned images or clips: set data.type=csv (a CSV with "
                          "path,text columns) or data.type=latents (a folder written by scripts/extract_latents.py "
                          "--pipeline); the embedded shapes data carries its own word-vector captions.")
    config = folder.transformer_config()
    if m.guidance is not None and not conditioning.guided(config):
        raise ConfigError(f"model.guidance={m.guidance:g} sets the guidance embedding of a guidance-distilled model, "
                          f"but {family.class_name} in {m.pipeline!r} has none: remove model.guidance.")
    if m.guidance_distilled and conditioning.guided(config):
        raise ConfigError(f"model.guidance_distilled=true declares a model distilled from classifier-free guidance "
                          f"without a guidance input, but {family.class_name} in {m.pipeline!r} embeds the guidance "
                          f"value (set it with model.guidance): remove model.guidance_distilled.")
    if d.type == "latents":
        _check_latents(cfg, folder, pipe)
    _resolve_sizes(cfg, folder, pipe)
    m.name, t.kind, t.max_length = family.class_name, "pipeline", tokens
    return folder


def _resolve_sizes(cfg, folder: PipelineFolder, pipe) -> None:
    """``data.num_frames`` / ``image_size`` (or every bucket) fit the pipeline: 1 frame for an image model,
    ``frame_ratio x n + 1`` frames for a video model, sides of whole latent patches."""
    d, family = cfg.data, folder.family
    adapter, conditioning = family.adapter, folder.conditioning
    config = folder.transformer_config()
    ratio, pixels = conditioning.frame_ratio(pipe), conditioning.pixel_ratio(pipe)
    _, ph, pw = adapter.patch_size(config)
    side = pixels * max(ph, pw)
    if adapter.image_only:
        if d.num_frames not in (None, 1) or any(b.get("frames", 1) != 1 for b in d.buckets or []):
            raise ConfigError(f"{family.class_name} is an image model: it trains on images (1-frame clips); remove "
                              f"data.num_frames (and frames from data.buckets).")
        d.num_frames = 1
    shapes = [(b.get("frames", 1), b.get("height"), b.get("width")) for b in d.buckets or []]
    if d.type in MEDIA_DATA_TYPES and not d.buckets:
        if d.num_frames is None:
            raise ConfigError(f"data.num_frames is not set: give the frames per clip to train {family.class_name} on "
                              f"({ratio} x n + 1, e.g. {ratio * 4 + 1}), or data.buckets.")
        if d.image_size is None:
            raise ConfigError(f"data.image_size is not set: give the side in pixels to train {family.class_name} on "
                              f"(a multiple of {side}), or data.buckets.")
    shapes.append((d.num_frames, d.image_size, d.image_size))
    for frames, height, width in shapes:
        check_clip_size(folder, pipe, frames, height, width, "the data asks for")


def check_clip_size(folder: PipelineFolder, pipe, frames: Optional[int], height: Optional[int],
                    width: Optional[int], asked: str) -> None:
    """A ConfigError unless a ``frames x height x width`` pixel clip (None: not given) is one the
    pipeline's VAE encodes and its transformer splits into whole patches: ``frame_ratio x n + 1``
    frames whose latent frames fill whole frame patches, sides of whole latent patches. ``asked``
    says who asks for the size ("the data asks for")."""
    family = folder.family
    adapter, conditioning = family.adapter, folder.conditioning
    config = folder.transformer_config()
    ratio, pixels = conditioning.frame_ratio(pipe), conditioning.pixel_ratio(pipe)
    _, ph, pw = adapter.patch_size(config)
    side = pixels * max(ph, pw)
    if frames is not None and not adapter.image_only and (frames - 1) % ratio:
        raise ConfigError(f"{folder.pipeline_class}'s VAE encodes {ratio} x n + 1 frames (its first frame alone, "
                          f"then {ratio} per latent frame), but {asked} {frames}: use "
                          f"{(frames - 1) // ratio * ratio + 1} or {((frames - 1) // ratio + 1) * ratio + 1}.")
    if frames is not None and not adapter.image_only:
        latent = conditioning.latent_frames(pipe, frames)
        pt = adapter.patch_size(config)[0]
        if latent % pt:
            raise ConfigError(f"{frames} frames make {latent} latent frames, which do not split into "
                              f"{family.class_name}'s {pt}-frame patches: choose a frame count whose latent "
                              f"frames are a multiple of {pt}.")
    for value in (height, width):
        if value is not None and value % side:
            raise ConfigError(f"{family.class_name} from {folder.path!r} takes sides of whole {side}-pixel patches "
                              f"(VAE {pixels}x, patches {ph}x{pw}), but {asked} {value} pixels: use a "
                              f"multiple of {side}.")


def _check_latents(cfg, folder: PipelineFolder, pipe) -> None:
    """Latents extracted by ``scripts/extract_latents.py --pipeline`` from this pipeline, at the sizes asked for."""
    d = cfg.data
    meta = video_latent_meta(d.path)
    if meta.get("format") != PIPELINE_FORMAT:
        raise ConfigError(f"'data.path' {d.path!r} holds no latents extracted from a pipeline (its meta.json does not "
                          f"say format={PIPELINE_FORMAT!r}): extract them with scripts/extract_latents.py --pipeline "
                          f"{folder.path}.")
    fingerprint = pipeline_fingerprint(folder.path)
    if meta.get("fingerprint") != fingerprint:
        raise ConfigError(f"the latents in {d.path!r} were extracted from the pipeline {meta.get('pipeline')!r} "
                          f"(fingerprint {meta.get('fingerprint')}), whose VAE, text encoders or settings differ from "
                          f"'model.pipeline' {folder.path!r} (fingerprint {fingerprint}): extract them again with "
                          f"--pipeline {folder.path}, or train that pipeline.")
    extracted_as = meta.get("pipeline_class")  # absent in latents extracted before it was recorded
    if extracted_as not in (None, folder.pipeline_class):
        raise ConfigError(f"the latents in {d.path!r} were extracted for {extracted_as}, but the run trains the folder "
                          f"as {folder.pipeline_class} (model.pipeline_class), which conditions the transformer on "
                          f"other inputs: extract them again with --pipeline-class {folder.pipeline_class} (or the "
                          f"run's --config), or set model.pipeline_class={extracted_as}.")
    sizes = sorted({tuple(s) for s in meta.get("pixel_sizes", [])})
    asked = [(d.num_frames, d.image_size, d.image_size)] + [
        (b.get("frames", 1), b.get("height"), b.get("width")) for b in d.buckets or []]
    listed = ", ".join("x".join(map(str, s)) for s in sizes)
    for frames, height, width in asked:
        if not any(all(a in (None, b) for a, b in zip((frames, height, width), s)) for s in sizes):
            raise ConfigError(f"the latents in {d.path!r} were extracted at {listed} "
                              f"pixels (frames x height x width), but the config asks for "
                              f"{'x'.join('?' if v is None else str(v) for v in (frames, height, width))}: remove "
                              f"data.num_frames / data.image_size (the latents give them), or extract the latents at "
                              f"that size.")
    if not d.buckets:
        if len(sizes) > 1:
            raise ConfigError(f"the latents in {d.path!r} come in {len(sizes)} sizes "
                              f"({listed}): list them in data.buckets (each "
                              f"with its batch_size) to train on all of them.")
        if sizes:
            d.num_frames, d.image_size = sizes[0][0], sizes[0][1]


# --------------------------------------------------------------------------------------------------
# The run's pieces
# --------------------------------------------------------------------------------------------------

def pipeline_recipe(cfg, x_shape: Sequence[int]) -> Recipe:
    """The family's objective and time distribution with the shift the pipeline's scheduler samples
    latent clips of ``x_shape`` (B, C, T, h, w) with."""
    folder = run_pipeline_folder(cfg)
    family, config = folder.family, folder.transformer_config()
    published = family.adapter.recipe(config, tokens=0)
    shift = folder.conditioning.shift(light_pipeline(folder.path, folder.pipeline_class), tuple(x_shape), config)
    return Recipe(published.objective, published.timestep_sampling, shift)


def latent_clip_shape(cfg, frames: int, height: int, width: int) -> Tuple[int, int, int, int]:
    """(C, T, h, w) of the latents of a ``frames x height x width`` pixel clip."""
    folder = run_pipeline_folder(cfg)
    family, pipe = folder.family, light_pipeline(folder.path, folder.pipeline_class)
    ratio = folder.conditioning.pixel_ratio(pipe)
    channels = family.adapter.latent_channels(folder.transformer_config())
    return channels, folder.conditioning.latent_frames(pipe, frames), height // ratio, width // ratio


class PipelineEncoders:
    """The pipeline's VAE and text encoders (loaded on ``device``, text in ``text_dtype``): clip batches
    to the latents and text inputs its ``__call__`` gives the transformer."""

    def __init__(self, folder: PipelineFolder, device, text_dtype: Optional[torch.dtype] = None):
        self.folder, self.family, self.conditioning = folder, folder.family, folder.conditioning
        self.pipe = load_pipeline(folder.path, device=device, text_dtype=text_dtype,
                                  pipeline_class=folder.pipeline_class)
        self.device = torch.device(device)

    @torch.no_grad()
    def encode(self, clips: torch.Tensor, captions: Sequence[str], images: Optional[Sequence[Sequence[torch.Tensor]]]
               = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """clips [B, 3, T, H, W] in [-1, 1], captions, and for an image-conditioned pipeline each sample's
        conditioning images ([3, H, W] in [-1, 1]) -> (latents [B, C, T', h, w], the per-sample inputs
        [B, ...]: text, the images' (``conditioning.image_keys``), and where the pipeline encodes the
        caption with the images, each sample's own unconditional text under ``null_text_key``)."""
        latents = encode_family_latents(self.family.encoding, self.pipe.vae, clips.to(self.device), sample=False)
        c = self.conditioning
        if images is None:
            if c.image_input != "none":
                raise ValueError(f"{self.folder.pipeline_class} is conditioned on images, but the batch has none")
            return latents, self.encode_text(captions)
        images = [[image.to(self.device) for image in sample] for sample in images]
        if c.null_text_per_image:
            inputs, null = c.encode_text_and_null(self.pipe, list(captions), images)
            inputs.update({null_text_key(k): v for k, v in null.items()})
        else:
            inputs = self.encode_text(captions)
        inputs.update(c.encode_images(self.pipe, images, tuple(clips.shape[2:])))
        return latents, inputs

    @torch.no_grad()
    def encode_text(self, captions: Sequence[str]) -> Dict[str, torch.Tensor]:
        return self.conditioning.encode_text(self.pipe, list(captions))

    def null_text(self) -> Dict[str, torch.Tensor]:
        """What the pipeline feeds its unconditional branch: its negative prompt (empty) encoded, [1, ...];
        nothing where it is encoded with each sample's images (then it comes with the sample)."""
        if self.conditioning.null_text_per_image:
            return {}
        return self.encode_text([self.conditioning.null_prompt])


def conditioning_images(folder: PipelineFolder):
    """How the CSV route reads the conditioning images of ``folder``'s pipeline (None: a text-only pipeline)."""
    from ..data.video_csv import ConditioningImages

    c = folder.conditioning
    if c.image_input == "none":
        return None
    size = functools.partial(c.reference_size, light_pipeline(folder.path, folder.pipeline_class)) \
        if c.image_input == "reference" else None
    return ConditioningImages(c.image_input, max(1, c.max_images), size)


def pipeline_csv_dataset(cfg, folder: PipelineFolder):
    """The CSV route's dataset of a run from ``folder``: its clips and captions, and the conditioning images
    its pipeline takes (``data.video_csv.ConditioningImages``), the rows checked first: an image for a
    text-only pipeline, an edit row without one, more than the pipeline takes, a missing or unreadable
    file are refused naming the rows."""
    from ..data.video_csv import media_dataset

    d = cfg.data
    try:
        dataset = media_dataset(d.type, d.path, d.num_frames, d.frame_interval, d.image_size,
                                images=conditioning_images(folder), require_captions=d.require_captions)
    except ValueError as e:
        raise ConfigError(f"'data.path': {e}.") from None
    check_conditioning_rows(folder, d.path, dataset.image_paths, dataset.where)
    return dataset


def _rows(where: Sequence[str]) -> str:
    return ", ".join(where[:10]) + (f" and {len(where) - 10} more" if len(where) > 10 else "")


def check_conditioning_rows(folder: PipelineFolder, csv: str, image_paths: Sequence[Tuple[str, ...]],
                            where: Sequence[str]) -> None:
    """A ConfigError naming the rows (``where``: "line 7" of a CSV, or a folder dataset's media file) whose
    conditioning images the pipeline of ``folder`` cannot take; ``csv``: the data, for the message."""
    c, name = folder.conditioning, folder.pipeline_class
    given = [row for row, paths in zip(where, image_paths) if paths]
    if c.image_input == "none" and given:
        image_pipelines = [v.pipeline for v in folder.family.variants if v.conditioning.image_input != "none"]
        also = f" (the {folder.family.name} family's image-conditioned pipelines: {', '.join(image_pipelines)})" \
            if image_pipelines else ""
        raise ConfigError(f"{csv}: {len(given)} row(s) name a conditioning image in the 'image' column (rows: "
                          f"{_rows(given)}), but {name} is a text-only pipeline and would ignore it: remove the "
                          f"'image' column, or train an image-conditioned pipeline's folder{also}.")
    if c.image_input == "reference":
        missing = [row for row, paths in zip(where, image_paths) if not paths]
        if missing:
            raise ConfigError(f"{csv}: {len(missing)} row(s) have no reference image (rows: {_rows(missing)}), "
                              f"which {name} edits: give each row its reference image in the 'image' column "
                              f"(several separated by '|'), or remove the rows.")
    most = max(1, c.max_images)
    many = [row for row, paths in zip(where, image_paths) if len(paths) > most]
    if many:
        raise ConfigError(f"{csv}: {len(many)} row(s) name more conditioning images than the {most} {name} takes "
                          f"(rows: {_rows(many)}): keep at most {most} per row.")
    if c.image_input == "first_last_frames":  # the clip's own frames, or a file for each of them
        few = [row for row, paths in zip(where, image_paths) if 0 < len(paths) < most]
        if few:
            raise ConfigError(f"{csv}: {len(few)} row(s) name {most - 1 if most == 2 else 'fewer'} image(s) in the "
                              f"'image' column (rows: {_rows(few)}), but {name} with this transformer starts and ends "
                              f"each video on given frames: name both files, 'first.png|last.png', or none (the "
                              f"clip's own first and last frames).")
    from PIL import Image, UnidentifiedImageError

    checked = set()  # a file named by several rows (repeats) is read once
    for line, paths in zip(where, image_paths):
        for path in paths:
            if path in checked:
                continue
            checked.add(path)
            if not os.path.isfile(path):
                raise ConfigError(f"{csv}, {line}: the conditioning image {path!r} does not exist: fix the "
                                  f"'image' column (paths are relative to the CSV's folder) or remove the row.")
            if path.lower().endswith(IMAGE_EXTENSIONS):
                try:
                    with Image.open(path) as im:
                        im.verify()  # the header and the file's structure (no full decode)
                except (OSError, UnidentifiedImageError, SyntaxError) as e:
                    raise ConfigError(f"{csv}, {line}: the conditioning image {path!r} cannot be decoded "
                                      f"({type(e).__name__}: {e}): replace the file or remove the row.") from None


def pipeline_denoiser(cfg, model: nn.Module, null_text: Mapping[str, torch.Tensor],
                      call: Optional[nn.Module] = None) -> PipelineDenoiser:
    """``model`` (the pipeline's transformer) called with the inputs its pipeline gives it; ``call`` is
    what to call instead of it (the booster's wrapper)."""
    folder = run_pipeline_folder(cfg)
    family = folder.family
    constants = folder.conditioning.constants(light_pipeline(folder.path, folder.pipeline_class), model.config,
                                              cfg.model.guidance)
    device = next(model.parameters()).device
    null = {k: v.to(device) for k, v in null_text.items()}
    return PipelineDenoiser(folder.conditioning, family.adapter, call if call is not None else model,
                            model.config, constants, null)
