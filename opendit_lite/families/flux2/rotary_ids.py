"""FLUX.2's four-axis rotary ids (time, row, column, text position) for a batch shape, built once per shape
and device: ``Flux2Pipeline``'s own ``_prepare_text_ids`` ((0, 0, 0, l) per text token) and
``_prepare_latent_ids`` ((0, row, column, 0) per latent pixel) build them on the CPU, a Python loop per
sample and a host-to-device copy, which a training or sampling step need not repeat at every call."""

import functools
from typing import Tuple

import torch


@functools.lru_cache(maxsize=16)
def rotary_ids(batch: int, text_tokens: int, height: int, width: int,
               device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(txt_ids [B, M, 4], img_ids [B, h*w, 4]) on ``device``, from the pipeline's helpers (what its
    ``__call__`` passes); callers do not write to them (they are shared)."""
    from diffusers import Flux2Pipeline

    txt_ids = Flux2Pipeline._prepare_text_ids(torch.empty(batch, text_tokens, 0))          # [B, M, 4]
    img_ids = Flux2Pipeline._prepare_latent_ids(torch.empty(batch, 0, height, width))     # [B, hw, 4]
    return txt_ids.to(device), img_ids.to(device)
