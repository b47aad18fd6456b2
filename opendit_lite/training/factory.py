"""Config -> objects shared by train.py and sample.py: the dataset, the model (with its input
geometry resolved from the data), the diffusion objective and the VAE."""

from typing import Optional, Tuple

import torch
import torch.nn as nn

from ..config import ConfigError, TrainConfig
from ..data import build_dataset
from ..data.skip_bad import SkipBadSamples
from ..diffusion import RectifiedFlow, build_scheduler
from ..diffusion.sampling_utils import SampleGenerators, standard_normal_like, standard_uniform
from ..models import build_model


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


def resolve_model_geometry(cfg: TrainConfig, dataset=None, vae=None) -> None:
    """Fill ``model.input_size``/``in_channels``/``num_classes`` left as None from the data (and the
    VAE's downsampling and latent channels), in place, so the saved config alone rebuilds the model
    (sample.py relies on that)."""
    m = cfg.model
    if m.input_size is None or m.in_channels is None:
        meta = getattr(dataset, "meta", None)  # precomputed latents describe themselves
        if meta:
            size, channels = [meta["height"], meta["width"]], meta["channels"]
        elif vae is not None:
            downsample = 2 ** (len(vae.config.block_out_channels) - 1)  # one halving per extra level
            size, channels = [cfg.data.image_size // downsample] * 2, vae.config.latent_channels
        else:
            size, channels = [cfg.data.image_size] * 2, 3
        m.input_size = m.input_size or size
        m.in_channels = m.in_channels or channels
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
    try:
        return build_model(m.name, input_size=model_input_hw(cfg), in_channels=m.in_channels,
                           num_classes=m.num_classes, learn_sigma=m.learn_sigma,
                           class_dropout_prob=m.class_dropout_prob)
    except KeyError as e:  # unknown name
        raise ConfigError(f"'model.name': {e.args[0]}") from None
    except ValueError as e:  # e.g. an input size the patch size does not divide
        raise ConfigError(f"{m.name} cannot take a model input of {model_input_hw(cfg)} (from data.image_size="
                          f"{cfg.data.image_size}{' and the VAE' if cfg.vae.path else ''}): {e}. Choose "
                          f"data.image_size so that image size / VAE factor is a multiple of the patch size.") from None


def build_training_objective(cfg: TrainConfig):
    """IDDPM or rectified flow from the ``diffusion`` section (image and video configs alike)."""
    d = cfg.diffusion
    if d.objective == "rflow":
        return build_scheduler("rflow", num_timesteps=d.diffusion_steps, sample_method=d.timestep_sampling)
    return build_scheduler("iddpm", noise_schedule=d.noise_schedule, learn_sigma=cfg.model.learn_sigma,
                           diffusion_steps=d.diffusion_steps)


def objective_loss(objective, model, x: torch.Tensor, model_kwargs: dict,
                   generator: Optional[SampleGenerators] = None) -> torch.Tensor:
    """Mean training loss of a batch x [B, ...] (clean latents or pixels, images or clips) under
    rectified flow (a time in [0, 1] per sample) or IDDPM (a uniform integer timestep per sample).

    ``generator``: one stream per sample (``SampleGenerators``) for its noise and time, so that a
    sample's draws do not depend on the rank or micro-batch it lands in; None: the global RNG."""
    noise = standard_normal_like(x, generator)                                    # [B, ...]
    if isinstance(objective, RectifiedFlow):
        t = objective.sample_time(x.shape[0], device=x.device, generator=generator)  # [B] in [0, 1]
        return objective.training_losses(model, x, model_kwargs=model_kwargs, noise=noise, t=t)["loss"].mean()
    u = standard_uniform((x.shape[0],), generator, x.device, torch.float64)         # [B] in [0, 1)
    t = (u * objective.num_timesteps).long().clamp_(max=objective.num_timesteps - 1)  # [B] integer steps
    return objective.training_losses(model, x, t, model_kwargs=model_kwargs, noise=noise)["loss"].mean()


def load_vae_from_config(cfg: TrainConfig, device) -> Optional[nn.Module]:
    if not cfg.vae.path:
        return None
    from ..encoders import load_vae

    return load_vae(cfg.vae.path, device=device)
