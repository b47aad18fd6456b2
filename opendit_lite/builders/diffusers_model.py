"""Config -> a diffusers transformer of a registered family (``model.name: WanTransformer3DModel``)
and its denoiser for the video trainer and sampler.

The model comes from exactly one of:

* ``model.pipeline``: a diffusers pipeline folder, its ``transformer/`` (``builders/pipeline.py`` checks
  the folder and conditions the model as the pipeline does); Wan 2.2 A14B's two experts, ``transformer/``
  and ``transformer_2/``, as one ``NoiseExperts`` or the one ``model.expert`` names
  (``builders/pipeline_experts.py``);
* ``model.path``: a local diffusers folder (``config.json`` and the weights, as ``save_pretrained``
  writes them, or a pipeline's ``transformer/`` folder), loaded by ``from_pretrained`` with
  nothing downloaded;
* ``model.config``: the class's constructor arguments for a random initialisation (diffusers'
  defaults fill what it leaves out).

The family's adapter (``opendit_lite.families``) then sets what the data must provide: caption
states of the model's text width (``model.caption_channels`` is filled with it, so the embedded
moving-shapes captions are drawn at that width), clips of its latent channels, 1-frame clips for
the image families (Flux, SD3), and the objective of its recipe (``diffusion.*`` left null).
"""

import inspect
import json
import os
from typing import Dict, Optional

import torch.nn as nn

from ..data.media_folders import MEDIA_DATA_TYPES
from ..errors import ConfigError
from ..families import FamilyDenoiser, Recipe, family_adapter, family_class_names, is_family
from .pipeline_experts import build_experts, trained_components

__all__ = ["build_diffusers_model", "check_family_inputs", "diffusers_config", "family_adapter", "family_denoiser",
           "family_names", "family_recipe", "is_family", "resolve_family_text"]


def family_names() -> str:
    return ", ".join(family_class_names())


def _diffusers_class(name: str) -> type:
    import diffusers

    return getattr(diffusers, name)


def model_folder(cfg) -> Optional[str]:
    """The local folder the model loads from: ``model.path``, or the pipeline's (first) trained
    transformer (``transformer/``; Wan 2.2's ``transformer_2/`` when the low-noise expert trains alone)."""
    m = cfg.model
    return os.path.join(m.pipeline, trained_components(cfg)[0]) if getattr(m, "pipeline", None) else m.path


def diffusers_config(cfg) -> Dict:
    """The model's full diffusers config: ``model.config`` or the folder's ``config.json``, over the
    class's defaults (read from its constructor, nothing is built)."""
    m = cfg.model
    if getattr(m, "pipeline", None):
        path = model_folder(cfg)
        with open(os.path.join(path, "config.json")) as f:
            given = json.load(f)
        params = inspect.signature(_diffusers_class(m.name).__init__).parameters
        defaults = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
        return {**defaults, **{k: v for k, v in given.items() if not k.startswith("_")}}
    if m.path and m.config:
        raise ConfigError(f"'model.path' and 'model.config' both set for {m.name}: give the local folder to load "
                          f"(model.path) or the constructor arguments of a random initialisation (model.config), "
                          f"not both.")
    path = m.path
    if not path and not m.config:
        raise ConfigError(f"{m.name} needs 'model.path' (a local diffusers folder with config.json, loaded with "
                          f"from_pretrained; nothing is downloaded) or 'model.config' (the constructor arguments of "
                          f"a random initialisation, e.g. {{num_layers: 2, num_attention_heads: 2, ...}}).")
    if path:
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file):
            hint = (" It holds a transformer/ folder: point model.path at it."
                    if os.path.isfile(os.path.join(path, "transformer", "config.json")) else "")
            raise ConfigError(f"'model.path' {path!r} holds no config.json, so it is not a diffusers model folder: "
                              f"point it at the folder save_pretrained wrote (config.json and the weights).{hint}")
        with open(file) as f:
            given = json.load(f)
        if given.get("_class_name", m.name) != m.name:
            raise ConfigError(f"'model.path' {path!r} holds a {given['_class_name']}, but model.name is {m.name}: "
                              f"set model.name={given['_class_name']}.")
    elif not isinstance(m.config, dict):
        raise ConfigError(f"'model.config' must be a mapping of {m.name}'s constructor arguments, got {m.config!r}.")
    else:
        given = dict(m.config)
    params = inspect.signature(_diffusers_class(m.name).__init__).parameters
    unknown = sorted(k for k in given if k not in params and not k.startswith("_"))
    if unknown and not path:
        raise ConfigError(f"'model.config' sets {unknown}, which {m.name} does not take; its arguments are: "
                          f"{', '.join(k for k in params if k != 'self')}.")
    defaults = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
    return {**defaults, **{k: v for k, v in given.items() if not k.startswith("_")}}


def build_diffusers_model(cfg) -> nn.Module:
    """The diffusers model ``model.name`` from ``model.path`` or ``model.config`` (module docstring)."""
    m = cfg.model
    cls = _diffusers_class(m.name)
    diffusers_config(cfg)  # the checks above
    def load(path: str) -> nn.Module:
        try:
            return cls.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, EnvironmentError) as e:
            where = "'model.pipeline'" if getattr(m, "pipeline", None) else "'model.path'"
            raise ConfigError(f"Cannot load {m.name} from {where} {path!r}: {e}") from None

    experts = build_experts(cfg, load)  # Wan 2.2 A14B, both experts: NoiseExperts
    if experts is not None:
        return experts
    path = model_folder(cfg)
    if path:
        return load(path)
    try:
        return cls(**m.config)
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"Cannot build {m.name} from 'model.config' {m.config}: {e}") from None


def resolve_family_text(cfg) -> None:
    """Fill ``model.caption_channels`` with the family's text width (a different value set by hand is
    a ConfigError) and check the model-section fields that do not apply to a diffusers model."""
    m = cfg.model
    config = diffusers_config(cfg)
    width = family_adapter(m.name).text_width(config)
    if m.caption_channels not in (None, width):
        raise ConfigError(f"model.caption_channels={m.caption_channels}, but {m.name} takes {width}-wide caption "
                          f"states: remove model.caption_channels (it is read from the model).")
    if m.learn_sigma:
        raise ConfigError(f"model.learn_sigma=true: {m.name} predicts no variance; set model.learn_sigma=false.")
    m.caption_channels = width


def check_family_inputs(cfg, buckets=None, caption_width: Optional[int] = None) -> None:
    """After the geometry is resolved from the data: the clips' channels and frames, and the width of
    the caption states the data or text encoder gives (``caption_width``; None: drawn at the model's),
    fit the model."""
    m, d = cfg.model, cfg.data
    adapter, config = family_adapter(m.name), diffusers_config(cfg)
    if caption_width not in (None, m.caption_channels):
        source = "text encoder" if d.type in MEDIA_DATA_TYPES else "precomputed caption states"
        raise ConfigError(f"{m.name} takes {m.caption_channels}-wide caption states, but the {source} give "
                          f"{caption_width}: use the text encoder the model was trained with (or extract the "
                          f"latents with it).")
    channels = adapter.latent_channels(config)
    if m.in_channels != channels:
        source = "pixel clips (no VAE)" if m.in_channels == 3 else "the data's latents"
        raise ConfigError(f"{m.name} takes {channels}-channel latent clips (its config says in_channels="
                          f"{config['in_channels']}), but {source} have {m.in_channels} channels: set vae.path to a "
                          f"VAE with {channels} latent channels, or (random init) model.config.in_channels and "
                          f"out_channels to fit the data.")
    frames = [b.frames for b in buckets] if buckets else [d.num_frames]
    if adapter.image_only and any(f != 1 for f in frames):
        raise ConfigError(f"{m.name} is an image model: it trains on images as 1-frame clips, but the data has "
                          f"{max(frames)} frames per clip; set data.num_frames=1 (and frames: 1 in every bucket).")


def family_recipe(cfg) -> Recipe:
    """The family's published objective for the resolved clip shape (its token count)."""
    from .video import model_clip_shape

    adapter, config = family_adapter(cfg.model.name), diffusers_config(cfg)
    _, T, H, W = model_clip_shape(cfg)
    pt, ph, pw = adapter.patch_size(config)
    return adapter.recipe(config, tokens=(T // pt) * (H // ph) * (W // pw))


def family_denoiser(cfg, model: nn.Module, call: Optional[nn.Module] = None) -> FamilyDenoiser:
    """``model`` (built by ``build_diffusers_model``) as the project's denoiser; ``call`` is what to
    call instead of it (the booster's wrapper)."""
    adapter = family_adapter(cfg.model.name)  # by name: Wan 2.2's NoiseExperts holds two models of the class
    return FamilyDenoiser(adapter, call if call is not None else model, model.config, cfg.text_encoder.max_length,
                          adapter.text_width(model.config))
