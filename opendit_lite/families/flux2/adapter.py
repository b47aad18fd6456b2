"""FLUX.2's adapter: its forward inputs from a clip batch and its training recipe: flow matching,
logit-normal training times, shifted as ``Flux2Pipeline`` samples the clip's token count at its default
50 steps (``exp(mu)`` of FLUX.2's empirical fit, ``compute_empirical_mu``: e^1.62 at 256 tokens, e^2.02
at 4096, 1024x1024, e^3.23 at 16384). FLUX.2 multiplies the time and the guidance by 1000 itself and
takes ``t``; its guidance embedding (the guidance-distilled dev model) is given ``GUIDANCE`` = 4,
``Flux2Pipeline``'s default.

The clips are the latents ``Flux2Pipeline`` denoises: the VAE's 2x2 patches already in the channels
(the transformer's ``in_channels``, 128 in the release, ``patch_size`` 1), so one latent pixel is one
token. Rotary ids have four axes (time, row, column, text position): (0, row, column, 0) for the image
tokens, (0, 0, 0, l) for the text's.
"""

import functools
import math
from typing import Tuple

import torch

from ..adapter_base import FamilyAdapter, Recipe

# The guidance embedding's value in training (the guidance-distilled dev model): Flux2Pipeline's default.
GUIDANCE = 4.0
# The step count the shift is fitted for (Flux2Pipeline's default num_inference_steps).
SAMPLING_STEPS = 50


@functools.lru_cache(maxsize=16)
def rotary_ids(batch: int, text_tokens: int, height: int, width: int,
               device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(txt_ids [B, M, 4], img_ids [B, h*w, 4]) on ``device``: ``Flux2Pipeline``'s own ``_prepare_text_ids``
    ((0, 0, 0, l) per text token) and ``_prepare_latent_ids`` ((0, row, column, 0) per latent pixel), what
    its ``__call__`` passes. They build them on the CPU (a Python loop per sample, then a host-to-device
    copy), so they are built once per batch shape and device; callers do not write to them (shared)."""
    from diffusers import Flux2Pipeline

    txt_ids = Flux2Pipeline._prepare_text_ids(torch.empty(batch, text_tokens, 0))          # [B, M, 4]
    img_ids = Flux2Pipeline._prepare_latent_ids(torch.empty(batch, 0, height, width))     # [B, hw, 4]
    return txt_ids.to(device), img_ids.to(device)


def empirical_shift(tokens: int, steps: int = SAMPLING_STEPS) -> float:
    """``exp(mu)`` of FLUX.2's empirical fit for ``tokens`` image tokens sampled in ``steps`` steps
    (diffusers' ``compute_empirical_mu``, imported when called)."""
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    return math.exp(compute_empirical_mu(image_seq_len=tokens, num_steps=steps))


class Flux2Adapter(FamilyAdapter):
    """FLUX.2: an image model; 1-frame clips of patch channels (one token per latent pixel), four-axis
    rotary ids, the Mistral states of three layers stacked as the caption (``joint_attention_dim``), no
    pooled text and no text mask (the pipeline keeps the padding states), the guidance embedding for
    guidance-distilled configs; the time t in [0, 1]."""

    class_name = "Flux2Transformer2DModel"
    text_width_key = "joint_attention_dim"
    pooled_width_key = None
    image_only = True

    def recipe(self, config, tokens):
        return Recipe("rflow", "logit-normal", empirical_shift(tokens))

    def patch_size(self, config):
        return 1, 1, 1

    def guidance_distilled(self, config):
        return bool(config.get("guidance_embeds"))

    def forward(self, model, config, x, t, states, mask, pooled):
        B, C, T, H, W = x.shape
        txt_ids, img_ids = rotary_ids(B, states.shape[1], H, W, x.device)   # the pipeline's: [B, M, 4], [B, N, 4]
        guidance = torch.full_like(t, GUIDANCE) if config.get("guidance_embeds") else None
        tokens = x[:, :, 0].flatten(2).transpose(1, 2)                                               # [B, N, C]
        out = model(hidden_states=tokens, timestep=t / 1000, guidance=guidance, encoder_hidden_states=states,
                    txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]                         # [B, N, C]
        return out.transpose(1, 2).reshape(B, C, 1, H, W)
