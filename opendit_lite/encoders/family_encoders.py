"""Loading a diffusers family's own VAE and text encoder, and turning raw VAE latents into what its
transformer trains on, for pre-computing latents and caption states (``scripts/extract_latents.py
--family``). What each family encodes with is its ``FamilyEncoders`` record, declared in
``opendit_lite/families/<family>/encoding.py``.

``latent_norm``, the inverse of what the family's diffusers pipeline does before decoding, so latents
stored here decode with that pipeline's VAE step:

* ``mean_std``: (z - mean) / std, with the VAE config's per-channel ``latents_mean`` / ``latents_std``;
* ``mean_std_scale``: (z - mean) x scaling_factor / std, with the VAE model's ``latents_mean`` /
  ``latents_std`` buffers;
* ``shift_scale``: (z - shift_factor) x scaling_factor (the VAE config's);
* ``scale``: z x scaling_factor;
* ``patch_batch_norm``: the VAE's 2x2 patches as channels ([C, h, w] -> [4C, h/2, w/2], channel-major),
  normalised by the VAE's own BatchNorm running statistics (``vae.bn``, AutoencoderKLFlux2): stored as
  the patched latents [4C, 1, h/2, w/2] the transformer takes one token per latent pixel of.

Image families (``image_only``) encode images, stored as 1-frame latents [C, 1, h, w] (through a VAE that
takes them as 1-frame clips where ``video_vae``: Qwen-Image's). Caption states
are the text encoder's last hidden states (the transformer's text width) with their padding mask.

Nothing here imports diffusers or transformers at import time; classes are looked up by name when
a folder is loaded.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ..errors import ConfigError
from .text import TextEncoder


@dataclass(frozen=True)
class FamilyEncoders:
    """What one family encodes with (see the module docstring for ``latent_norm``)."""

    transformer: str                       # the diffusers transformer class (``model.name`` in a config)
    vae: str                               # the diffusers VAE class
    latent_norm: str                       # "mean_std", "mean_std_scale", "shift_scale", "scale", "patch_batch_norm"
    text_models: Tuple[str, ...]           # transformers ``model_type``s of the text encoder it takes
    max_length: int                        # caption tokens, as the family's pipeline pads them
    image_only: bool = False               # an image model: 1-frame clips
    video_vae: bool = False                # its VAE takes images as 1-frame clips [B, 3, 1, H, W] (Qwen-Image's)
    # The pipeline's folders of that text encoder and its tokenizer (Flux's T5 is its second encoder,
    # SD3's its third).
    text_folders: Tuple[str, str] = ("text_encoder", "tokenizer")
    # Pixels per row (and column) of the stored latents: the VAE's factor, times the patch side where the
    # latents are stored patched into channels (FLUX.2's 8 x 2); the planner's image sizes of a model.path run.
    pixels_per_latent: int = 8
    # The VAE encodes one clip at a time (HunyuanVideo 1.5's fails on a batch of more than one).
    one_clip_at_a_time: bool = False


# transformers' class for each text-encoder model type (the encoder half only for T5s).
TEXT_MODEL_CLASSES = {"t5": "T5EncoderModel", "umt5": "UMT5EncoderModel", "llama": "LlamaModel",
                      "qwen2_5_vl_text": "Qwen2_5_VLTextModel"}


def _json_config(path: str, what: str) -> dict:
    import json
    import os

    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: cannot read its config.json ({e}); give a folder written by save_pretrained.") \
            from None


def load_family_vae(spec: FamilyEncoders, path: str, what: str, device="cpu") -> nn.Module:
    """The family's VAE from the local folder ``path`` (config.json naming ``spec.vae``; safetensors)."""
    import diffusers

    found = _json_config(path, what).get("_class_name")
    if found != spec.vae:
        raise ConfigError(f"{what} holds a {found or 'model without _class_name'}; the {spec.transformer} family "
                          f"encodes with a diffusers {spec.vae}.")
    vae = getattr(diffusers, spec.vae).from_pretrained(path, use_safetensors=True, local_files_only=True)
    return vae.to(device).eval().requires_grad_(False)


def load_family_text_encoder(spec: FamilyEncoders, path: str, what: str, max_length: Optional[int] = None,
                             device="cpu", tokenizer_path: Optional[str] = None) -> TextEncoder:
    """The family's text encoder from the local folder ``path``, its tokenizer from
    ``tokenizer_path`` (None: the same folder)."""
    import transformers

    model_type = _json_config(path, what).get("model_type")
    if model_type not in spec.text_models:
        raise ConfigError(f"{what} holds a {model_type or 'model without model_type'} text model; the "
                          f"{spec.transformer} family encodes captions with {' or '.join(spec.text_models)}.")
    if model_type not in TEXT_MODEL_CLASSES:  # the family's pipeline encodes it its own way (a chat template, ...)
        raise ConfigError(f"{what} holds the {spec.transformer} family's {model_type} text encoder, whose caption "
                          f"states only its pipeline's own encode_prompt gives (see the family's encoding.py): "
                          f"extract the latents with scripts/extract_latents.py --pipeline <the pipeline folder>.")
    model_cls = getattr(transformers, TEXT_MODEL_CLASSES[model_type])
    from .pipeline_folder import has_tokenizer

    if not has_tokenizer(tokenizer_path or path):  # transformers would make one from the config alone: all <unk>
        raise ConfigError(f"the tokenizer folder {tokenizer_path or path!r} holds no tokenizer files, so captions "
                          f"would be encoded as unknown tokens: give the tokenizer's folder (a pipeline's tokenizer/) "
                          f"or save it beside the encoder.")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path or path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"the tokenizer folder {tokenizer_path or path!r} holds no usable tokenizer ({e}); give "
                          f"the tokenizer's folder (a pipeline's tokenizer/) or save it beside the encoder.") from None
    model = model_cls.from_pretrained(path, use_safetensors=True, local_files_only=True).to(device)
    return TextEncoder(tokenizer, model, max_length or spec.max_length, model_type)


def _channel(values, like: torch.Tensor) -> torch.Tensor:
    """Per-channel constants as [1, C, 1, 1, 1] for latents [B, C, T, h, w]."""
    return torch.as_tensor(values, dtype=like.dtype, device=like.device).view(1, -1, 1, 1, 1)


def normalize_latents(spec: FamilyEncoders, vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Raw VAE latents [B, C, T, h, w] -> what the family's transformer is trained on."""
    c = vae.config
    if spec.latent_norm == "mean_std":
        return (z - _channel(c.latents_mean, z)) / _channel(c.latents_std, z)
    if spec.latent_norm == "mean_std_scale":
        return (z - _channel(vae.latents_mean, z)) * c.scaling_factor / _channel(vae.latents_std, z)
    if spec.latent_norm == "shift_scale":
        return (z - (c.shift_factor or 0.0)) * c.scaling_factor
    if spec.latent_norm == "patch_batch_norm":
        return patch_batch_norm(vae, z)
    return z * c.scaling_factor


def patch_batch_norm(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Raw latents [B, C, T, h, w] -> the VAE's 2x2 patches as channels [B, 4C, T, h/2, w/2] (channel c's
    patch position (i, j) at 4c + 2i + j), normalised by its BatchNorm running mean and variance."""
    B, C, T, h, w = z.shape
    p = z.reshape(B, C, T, h // 2, 2, w // 2, 2).permute(0, 1, 4, 6, 2, 3, 5).reshape(B, 4 * C, T, h // 2, w // 2)
    bn = vae.bn
    mean = _channel(bn.running_mean.float(), p)
    std = torch.sqrt(_channel(bn.running_var.float(), p) + vae.config.batch_norm_eps)
    return (p - mean) / std


@torch.no_grad()
def encode_family_latents(spec: FamilyEncoders, vae: nn.Module, clips: torch.Tensor,
                          sample: bool = True) -> torch.Tensor:
    """clips [B, 3, T, H, W] in [-1, 1] -> normalised latents [B, C, T', h, w] (images: T = T' = 1);
    ``sample``: draw from the posterior (else its mean)."""
    if spec.image_only:                                                   # [B, 3, 1, H, W] or [B, 3, H, W]
        x = clips[:, :, :1] if spec.video_vae else clips[:, :, 0]
    else:
        x = clips                                                         # [B, 3, T, H, W]
    x = x.to(next(vae.parameters()).dtype)
    dists = [vae.encode(c).latent_dist for c in (x.split(1) if spec.one_clip_at_a_time else (x,))]
    z = torch.cat([(d.sample() if sample else d.mode()).float() for d in dists])
    if spec.image_only and not spec.video_vae:
        z = z.unsqueeze(2)                                                # [B, C, 1, h, w]
    return normalize_latents(spec, vae, z)
