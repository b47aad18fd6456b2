"""Encode/decode latent clips with a 2D image VAE (diffusers' AutoencoderKL) applied per frame.

Three ways to make that cheaper, each with the same result as the plain per-frame encode:

* **sliced** (``micro_batch``): frames go through the VAE ``micro_batch`` at a time, so peak
  activation memory is that of ``micro_batch`` frames rather than of B*T (a 16x256x256 clip is 16
  full-resolution images; the VAE's activations, not its 84M parameters, are what run out).
* **DP VAE** (``sp_group``): the ranks of a sequence-parallel group hold the same clips, so rather
  than each encoding all frames, each encodes 1/P of them and an all-gather reassembles the clip.
* **compiled encode** (``compile_encode``): ``torch.compile`` of the per-chunk encode; where the
  compiler is unavailable (no working C compiler or Triton, an unsupported platform) the first
  call falls back to the eager function with a warning instead of failing the run.

Latents are ``[B, C, T, h, w]`` scaled by ``scale_factor``. Encoding uses the posterior mean
(``sample=False``) by default where exact equality matters; training may sample.
"""

import warnings
from typing import Callable, Optional

import torch
import torch.distributed as dist

from .vae import vae_decode, vae_encode


def _frames(video: torch.Tensor) -> torch.Tensor:
    """[B, C, T, H, W] -> [B*T, C, H, W] (frame-major within each clip)."""
    return video.permute(0, 2, 1, 3, 4).flatten(0, 1)


def _clips(frames: torch.Tensor, batch: int) -> torch.Tensor:
    """[B*T, C, H, W] -> [B, C, T, H, W]."""
    return frames.unflatten(0, (batch, -1)).permute(0, 2, 1, 3, 4)


def compile_encode(encode: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``torch.compile(encode)``, falling back to ``encode`` if compiling or the first compiled call fails."""
    try:
        compiled = torch.compile(encode, dynamic=False)
    except Exception as err:  # torch.compile itself refuses (e.g. unsupported Python)
        warnings.warn(f"torch.compile unavailable ({err}); VAE encode runs eagerly")
        return encode
    state = {"fn": compiled}

    def run(x: torch.Tensor) -> torch.Tensor:
        try:
            return state["fn"](x)
        except Exception as err:  # backend failure on first use: no compiler, no Triton, ...
            if state["fn"] is encode:
                raise
            warnings.warn(f"compiled VAE encode failed ({type(err).__name__}: {err}); falling back to eager")
            state["fn"] = encode
            return encode(x)

    return run


class VideoVAE:
    """Per-frame AutoencoderKL for clips; see the module docstring for the three options."""

    def __init__(self, vae, scale_factor: float = 0.18215, micro_batch: Optional[int] = None,
                 sp_group: Optional[dist.ProcessGroup] = None, compile: bool = False, sample: bool = False):
        if micro_batch is not None and micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1 (frames per VAE call) or None, got {micro_batch}")
        self.vae = vae
        self.scale_factor = scale_factor
        self.micro_batch = micro_batch
        self.sp_group = sp_group
        self.sample = sample
        self._encode_chunk = self._encode_frames
        if compile:
            self._encode_chunk = compile_encode(self._encode_frames)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def latent_channels(self) -> int:
        return self.vae.config.latent_channels

    def _encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        return vae_encode(self.vae, frames, self.scale_factor, sample=self.sample)

    def _encode_sliced(self, frames: torch.Tensor) -> torch.Tensor:
        step = self.micro_batch or max(frames.shape[0], 1)
        return torch.cat([self._encode_chunk(chunk) for chunk in frames.split(step)])   # [F, c, h, w]

    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """video [B, 3, T, H, W] in [-1, 1] -> latents [B, c, T, H/f, W/f]."""
        B = video.shape[0]
        frames = _frames(video)                                                       # [B*T, 3, H, W]
        size = 1 if self.sp_group is None or not dist.is_initialized() else dist.get_world_size(self.sp_group)
        if size == 1:
            return _clips(self._encode_sliced(frames), B)
        # DP VAE: rank r encodes frames [r*chunk, (r+1)*chunk), padded by repeating the last frame.
        count = frames.shape[0]
        chunk = -(-count // size)
        padded = torch.cat([frames, frames[-1:].expand(chunk * size - count, *frames.shape[1:])])
        rank = dist.get_rank(self.sp_group)
        mine = self._encode_sliced(padded[rank * chunk:(rank + 1) * chunk]).contiguous()  # [chunk, c, h, w]
        gathered = mine.new_empty((chunk * size,) + mine.shape[1:])
        dist.all_gather_into_tensor(gathered, mine, group=self.sp_group)
        return _clips(gathered[:count], B)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [B, c, T, h, w] -> video [B, 3, T, H, W] in [-1, 1], ``micro_batch`` frames at a time."""
        B = latents.shape[0]
        frames = _frames(latents)
        step = self.micro_batch or max(frames.shape[0], 1)
        return _clips(torch.cat([vae_decode(self.vae, f, self.scale_factor) for f in frames.split(step)]), B)
