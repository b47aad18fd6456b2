"""Config -> objects of the image trainer and sampler (train.py, sample.py, the planner): the
dataset, the model (with its input geometry resolved from the data) and the VAE."""

from typing import Optional, Tuple

import torch.nn as nn

from ..config import TrainConfig
from ..data import build_dataset
from ..data.skip_bad import SkipBadSamples
from ..errors import ConfigError
from ..models import MODELS, build_model, registered_class


def build_dataset_from_config(cfg: TrainConfig):
    d = cfg.data
    return with_bad_sample_skipping(lambda: build_dataset(
        d.type, path=d.path, image_size=d.image_size, num_samples=d.num_samples, random_flip=d.random_flip,
        seed=cfg.global_seed), cfg)


def with_bad_sample_skipping(build, cfg):
    """``build()``'s dataset, its errors as one-paragraph ConfigErrors, and wrapped so that files
    failing to decode are skipped with a warning when it reads files (declares ``sample_path``)."""
    try:
        dataset = build()
    except ValueError as e:
        raise ConfigError(f"Cannot use 'data.path' {cfg.data.path!r} as data.type={cfg.data.type}: {e}.") from None
    if hasattr(dataset, "sample_path"):
        dataset = SkipBadSamples(dataset, cfg.max_bad_data_fraction)
    return dataset


def resolve_model_geometry(cfg: TrainConfig, dataset=None, vae=None, fed_data: bool = True) -> None:
    """Fill ``model.input_size``/``in_channels``/``num_classes`` left as None from the data (and the
    VAE's downsampling and latent channels), in place, so the saved config alone rebuilds the model
    (sample.py relies on that). When the data is ``fed_data`` to the model (training), a size or
    channel count set in the config that the data does not have is refused before the model is built."""
    m = cfg.model
    meta = getattr(dataset, "meta", None)  # precomputed latents describe themselves
    if meta:
        size, channels = [meta["height"], meta["width"]], meta["channels"]
        source, remedy = f"The latents in '{cfg.data.path}'", "extract latents of that size"
    elif vae is not None:
        downsample = 2 ** (len(vae.config.block_out_channels) - 1)  # one halving per extra level
        size, channels = [cfg.data.image_size // downsample] * 2, vae.config.latent_channels
        source = (f"The VAE latents of data.image_size={cfg.data.image_size} images ({downsample}x downsampling, "
                  f"{channels} latent channels)")
        remedy = "set data.image_size to the model's size times the VAE's downsampling"
    else:
        size, channels = [cfg.data.image_size] * 2, 3
        source = f"The images in pixel space (no vae.path), data.image_size={cfg.data.image_size} RGB,"
        remedy = "set data.image_size to the model's size (or vae.path to train on latents)"
    m.input_size = m.input_size or size
    m.in_channels = m.in_channels or channels
    if fed_data and (channels, *size) != (m.in_channels, *model_input_hw(cfg)):  # its patch embedding would refuse
        raise ConfigError(f"{source} are {channels} x {size[0]} x {size[1]} (channels x height x width), but the "
                          f"model is set for {m.in_channels} x {' x '.join(map(str, model_input_hw(cfg)))} "
                          f"(model.in_channels, model.input_size): remove model.input_size and model.in_channels to "
                          f"take them from the data, or {remedy}.")
    if m.num_classes is None:
        classes = getattr(dataset, "classes", None)
        if not classes:
            raise ValueError("model.num_classes is not set and the dataset does not list its classes")
        m.num_classes = len(classes)


def model_input_hw(cfg: TrainConfig) -> Tuple[int, int]:
    """(H, W) of the model input from ``model.input_size`` ([S] or [H, W])."""
    size = cfg.model.input_size
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])


def build_model_from_config(cfg: TrainConfig) -> nn.Module:
    m = cfg.model
    spacing = {}  # passed only when not the default, so models without the choice build as before
    if m.timestep_spacing != "meta" and m.name in MODELS:  # an unknown name: build_model says so below
        if m.timestep_spacing not in getattr(registered_class(m.name), "timestep_spacings", ("meta",)):
            raise ConfigError(f"model.timestep_spacing={m.timestep_spacing!r} is not available for {m.name!r} (only "
                              f"DiT models take it, to match diffusers' DiTTransformer2DModel); remove the setting.")
        spacing = {"timestep_spacing": m.timestep_spacing}
    try:
        return build_model(m.name, input_size=model_input_hw(cfg), in_channels=m.in_channels,
                           num_classes=m.num_classes, learn_sigma=m.learn_sigma,
                           class_dropout_prob=m.class_dropout_prob, **spacing)
    except KeyError as e:  # unknown name
        raise ConfigError(f"'model.name': {e.args[0]}") from None
    except ValueError as e:  # e.g. an input size the patch size does not divide
        raise ConfigError(f"{m.name} cannot take a model input of {model_input_hw(cfg)} (from data.image_size="
                          f"{cfg.data.image_size}{' and the VAE' if cfg.vae.path else ''}): {e}. Choose "
                          f"data.image_size so that image size / VAE factor is a multiple of the patch size.") from None


def load_vae_from_config(cfg: TrainConfig, device) -> Optional[nn.Module]:
    if not cfg.vae.path:
        return None
    from ..encoders import load_vae

    return load_vae(cfg.vae.path, device=device)
