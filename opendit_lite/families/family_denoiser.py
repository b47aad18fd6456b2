"""``FamilyDenoiser``: a diffusers model of a registered family seen as the project's text-to-video
denoiser ``(x [B, C, T, H, W], t [B], y [B, M, W], mask [B, M]) -> [B, C, T, H, W]``, the call every
objective (``objective_loss``) and sampler makes, with the capabilities the trainer and the
guidance read declared on it.

* Padding tokens of the caption are zeroed (the families without a text mask see zeros there, as
  their pipelines pad).
* Condition dropout (``drop`` [B] bool, drawn by the trainer per sample) and the unconditional half
  of guidance use the same null caption: zero states with a full mask (the families have no
  learned null caption; their fine-tuning recipes drop to an empty or zero caption).
* The pooled text vector of Flux, SD3 and HunyuanVideo is derived from the caption states: their
  masked mean, mapped to the pooled width by a fixed seeded projection (the identity when the
  widths agree). It lets the embedded demo and any single text encoder condition these models;
  the release checkpoints' pooled CLIP vector is a second encoder this route does not run.
"""

from typing import Mapping, Optional, Tuple

import torch
import torch.nn as nn

from .adapter_base import FamilyAdapter

POOLED_PROJECTION_SEED = 0


class FamilyDenoiser:
    """``model`` (the raw diffusers model, or the booster's wrapper of it) called through its family
    ``adapter``; ``config`` is the model's diffusers config, ``text_tokens`` x ``text_width`` the caption
    states it is given (for the null caption)."""

    is_video = True
    guidance_layout = "paired"          # B clips in, the null caption added inside (models/cfg_layouts.py)
    condition_dropout_kwarg = "drop"

    def __init__(self, adapter: FamilyAdapter, model: nn.Module, config: Mapping, text_tokens: int,
                 text_width: int, counting: bool = False):
        self.adapter, self.model, self.config = adapter, model, config
        self.counting = counting  # the planner's meta-device count: the adapter's ``counting_forward``
        self.text_tokens, self.text_width = text_tokens, text_width
        self._projection: Optional[torch.Tensor] = None
        self._projection_on: Optional[torch.Tensor] = None

    @property
    def guidance_distilled(self) -> bool:
        """The model takes the guidance scale as an input (Flux-dev, HunyuanVideo): no unconditional branch."""
        return self.adapter.guidance_distilled(self.config)

    @property
    def patch_size(self) -> Tuple[int, int, int]:
        return self.adapter.patch_size(self.config)

    def null_caption(self, batch_size: int) -> torch.Tensor:
        """Zero caption states [B, M, W] (used with a full mask), on the model's device."""
        device = next(self.model.parameters()).device
        return torch.zeros(batch_size, self.text_tokens, self.text_width, device=device)

    def pooled(self, states: torch.Tensor, mask: torch.Tensor) -> Optional[torch.Tensor]:
        """[B, M, W] states, [B, M] mask -> [B, P] pooled text (None: the family takes none)."""
        width = self.adapter.pooled_width(self.config)
        if width is None:
            return None
        keep = mask.to(states.dtype).unsqueeze(-1)                                   # [B, M, 1]
        mean = (states * keep).sum(1) / keep.sum(1).clamp(min=1)                     # [B, W]
        if width == states.shape[-1]:
            return mean
        p = self._projection  # the fp32 master on the CPU; its copy on the states' device and dtype is kept
        if p is None or p.shape != (states.shape[-1], width):
            g = torch.Generator().manual_seed(POOLED_PROJECTION_SEED)
            p = self._projection = torch.randn(states.shape[-1], width, generator=g) / states.shape[-1] ** 0.5
            self._projection_on = p
        if self._projection_on.device != states.device or self._projection_on.dtype != states.dtype:
            self._projection_on = p.to(states.device, states.dtype)  # once, not every step
        p = self._projection_on
        return mean @ p                                                              # [B, P]

    def __call__(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, mask: Optional[torch.Tensor] = None,
                 drop: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x [B, C, T, H, W], t [B] (the objective's timestep), y [B, M, W], mask [B, M] bool, drop [B]
        bool -> the prediction [B, C, T, H, W]."""
        mask = torch.ones(y.shape[:2], dtype=torch.bool, device=y.device) if mask is None else mask.bool()
        if drop is not None:
            y = torch.where(drop[:, None, None], torch.zeros_like(y), y)
            mask = mask | drop[:, None]
        y = y * mask.unsqueeze(-1).to(y.dtype)                                       # zero padding tokens
        forward = self.adapter.counting_forward if self.counting else self.adapter.forward
        return forward(self.model, self.config, x, t, y, mask, self.pooled(y, mask))
