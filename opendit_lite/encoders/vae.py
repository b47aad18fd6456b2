"""The latent autoencoder: diffusers' AutoencoderKL loaded from a local folder.

Nothing is fetched from a hub: ``path`` must be a folder with ``config.json`` and the weights, as
written by ``AutoencoderKL.save_pretrained``. ``encode``/``decode`` apply the scale factor so the
diffusion model sees unit-variance latents.
"""

import os
import pickle

import torch

from ..errors import ConfigError


def load_vae(path: str, dtype: torch.dtype = torch.float32, device="cpu"):
    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "config.json")):
        raise ConfigError(
            f"'vae.path' {path!r} is not a folder with a config.json: point vae.path at a local "
            f"AutoencoderKL folder (AutoencoderKL.save_pretrained output); nothing is downloaded."
        )
    from diffusers.models import AutoencoderKL

    try:
        vae = AutoencoderKL.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
    except Exception as e:  # diffusers raises OSError, ValueError, EnvironmentError, UnpicklingError, ...
        chain, cause = [], e
        while cause is not None and len(chain) < 8:  # diffusers re-raises torch's refusal as an OSError
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        if any(isinstance(c, pickle.UnpicklingError) or "Weights only load failed" in str(c) for c in chain):
            why = ("its weights file holds pickled Python objects besides tensors, and loading it would run code "
                   "from the file, so it is refused; re-save the VAE with AutoencoderKL.save_pretrained (safetensors)")
        else:
            why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        raise ConfigError(f"'vae.path' {path!r} cannot be loaded as an AutoencoderKL: {why}.") from None
    return vae.to(device).eval().requires_grad_(False)


@torch.no_grad()
def vae_encode(vae, images: torch.Tensor, scale_factor: float, sample: bool = True) -> torch.Tensor:
    """images [B, 3, H, W] in [-1, 1] -> latents [B, C, H/8, W/8] times ``scale_factor``."""
    dist = vae.encode(images.to(vae.dtype)).latent_dist
    z = dist.sample() if sample else dist.mode()
    return z * scale_factor


@torch.no_grad()
def vae_decode(vae, latents: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """latents [B, C, h, w] (scaled) -> images [B, 3, 8h, 8w] in [-1, 1]."""
    return vae.decode(latents.to(vae.dtype) / scale_factor).sample.clamp(-1, 1)
