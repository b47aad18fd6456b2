"""``PipelineDenoiser``: a transformer of a registered family trained from its diffusers pipeline folder
(``model.pipeline``), seen as the denoiser every objective calls, ``(x [B, C, T, h, w], t [B], **text)
-> [B, C, T, h, w]``, where ``text`` are the per-sample inputs the pipeline's ``encode_prompt`` gives
(``encoder_hidden_states``, ``pooled_projections``, ``encoder_attention_mask``, by the family).

Every keyword the transformer receives is the one the pipeline's ``__call__`` passes it for the same
latents, time and caption (the family's ``conditioning``). Condition dropout (``drop`` [B] bool,
drawn by the trainer per sample) feeds a dropped sample what the pipeline feeds its unconditional
branch: the encoded empty prompt (``null_text``, [1, ...] per keyword), not zeros. The inputs of the
conditioning images (``conditioning.image_keys``) stay: the pipeline's unconditional branch sees the
same image; where the unconditional text is encoded with each sample's images
(``conditioning.null_text_per_image``), a sample's own null text comes with its inputs under
``null_text_key(key)``.
"""

from typing import Any, Dict, Mapping, Optional, Tuple

import torch
import torch.nn as nn

from .adapter_base import FamilyAdapter
from .conditioning_base import NULL_PREFIX, PipelineConditioning, null_text_key, rows_where


class PipelineDenoiser:
    """``model`` (the raw diffusers model, or the booster's wrapper of it) called with the inputs of the
    family's pipeline; ``config`` is the model's diffusers config, ``constants`` the conditioning's
    per-run inputs, ``null_text`` the encoded empty prompt."""

    is_video = True
    condition_dropout_kwarg = "drop"

    def __init__(self, conditioning: PipelineConditioning, adapter: FamilyAdapter, model: nn.Module, config: Mapping,
                 constants: Mapping[str, Any], null_text: Mapping[str, torch.Tensor]):
        missing = set(() if conditioning.null_text_per_image else conditioning.text_keys) - set(null_text)
        if missing:
            raise ValueError(f"the null text lacks {sorted(missing)}")
        self.conditioning, self.adapter, self.model = conditioning, adapter, model
        self.config, self.constants, self.null_text = config, dict(constants), dict(null_text)

    @property
    def patch_size(self) -> Tuple[int, int, int]:
        return self.adapter.patch_size(self.config)

    def inputs(self, x: torch.Tensor, t: torch.Tensor, drop: Optional[torch.Tensor] = None,
               **text: torch.Tensor) -> Dict[str, Any]:
        """The transformer's keyword arguments for x [B, C, T, h, w], t [B] and the text (and image) inputs."""
        inputs = {k: v for k, v in text.items() if not k.startswith(NULL_PREFIX)}
        if drop is not None:
            for k in self.conditioning.text_keys:
                if k in inputs:
                    null = text[null_text_key(k)] if self.conditioning.null_text_per_image else self.null_text[k]
                    inputs[k] = rows_where(drop, null, inputs[k])
        return self.conditioning.inputs(self.config, self.constants, x, t, inputs)

    def loss_mask(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Where the loss counts for latent clips x [B, C, T, h, w] (None: everywhere): the pipeline's
        conditioning keeps some latents as given (Wan 2.2 TI2V's first frame)."""
        return self.conditioning.loss_mask(self.config, self.constants, x)

    def __call__(self, x: torch.Tensor, t: torch.Tensor, drop: Optional[torch.Tensor] = None,
                 **text: torch.Tensor) -> torch.Tensor:
        """x [B, C, T, h, w], t [B] (the objective's timestep), drop [B] bool, text inputs [B, ...]
        -> the prediction [B, C, T, h, w]."""
        out = self.model(**self.inputs(x, t, drop, **text), return_dict=False)[0]
        return self.conditioning.prediction(out, x, self.config, self.constants)
