"""The pipeline-conditioning protocol: what every ``opendit_lite/families/<family>/conditioning.py``
implements (the family's registry record holds an instance), so that a training step feeds the
transformer exactly what the family's diffusers pipeline (``<Family>Pipeline.__call__``) feeds it at
the same caption, latents and time.

A conditioning works with the pipeline object (``diffusers.DiffusionPipeline``, loaded from the
``model.pipeline`` folder without its transformers) and only through what the pipeline itself
does: its ``encode_prompt`` with the keyword arguments and defaults its ``__call__`` passes, its
static packing and id helpers, its scale factors and scheduler configuration:

* ``encode_text(pipe, prompts)``: the per-sample text inputs of the transformer, by the
  transformer's keyword names (``encoder_hidden_states``, ``pooled_projections``,
  ``encoder_attention_mask``), as ``__call__`` computes them; ``encode_text(pipe, [""])`` is what it
  feeds its unconditional branch (every family's default negative prompt is empty), which caption
  dropout trains on;
* ``constants(pipe, model_config, guidance)``: the inputs that do not depend on the sample (the
  guidance value of guidance-distilled models, LTX-Video's rope interpolation scale, ...);
* ``inputs(model_config, constants, x, t, text)``: the transformer's keyword arguments for latent
  clips x [B, C, T, h, w] (images: T = 1, as the families' latents are stored), the objective's
  timestep t [B] (flow time x 1000, or the integer DDPM step) and the text inputs; ``prediction``
  maps the transformer's output back to [B, C, T, h, w];
* ``expert_boundary(pipe)``: where a pipeline of two experts (Wan 2.2 A14B) switches from
  ``transformer`` to ``transformer_2``;
* ``shift(pipe, x_shape)``: the flow shift the pipeline's scheduler samples latents of that shape
  with (a token-count shift through diffusers' ``calculate_shift`` where the scheduler shifts
  dynamically);
* ``frame_ratio`` / ``pixel_ratio``: pixels per latent frame and per latent row, from the
  pipeline's own scale factors (video clips hold ``frame_ratio x n + 1`` frames).

Nothing here imports diffusers at import time.
"""

import inspect
import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch

from ..errors import ConfigError


def call_default(pipe, name: str) -> Any:
    """The default of ``name`` in ``type(pipe).__call__`` (what the pipeline uses when not told)."""
    parameter = inspect.signature(type(pipe).__call__).parameters.get(name)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        raise KeyError(f"{type(pipe).__name__}.__call__ has no default for {name!r}")
    return parameter.default


def flow_shift(scheduler_config: Mapping, tokens: int, max_shift_default: float = 1.15) -> float:
    """The time shift a ``FlowMatchEulerDiscreteScheduler`` configured by ``scheduler_config`` samples
    ``tokens`` latent tokens with: ``exp(calculate_shift(tokens, ...))`` (diffusers' helper, with the
    defaults the pipelines give it) when it shifts dynamically, else its fixed ``shift``."""
    c = scheduler_config
    if not c.get("use_dynamic_shifting"):
        return float(c.get("shift", 1.0))
    if c.get("time_shift_type", "exponential") != "exponential":
        raise ConfigError(f"the pipeline's scheduler shifts times with time_shift_type={c['time_shift_type']!r}; "
                          f"training reproduces the exponential shift only.")
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    mu = calculate_shift(tokens, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                         c.get("base_shift", 0.5), c.get("max_shift", max_shift_default))
    return math.exp(mu)


def rows_where(drop: torch.Tensor, null: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` [B, ...] with the rows where ``drop`` [B] is true replaced by ``null`` [1, ...]."""
    keep = drop.view(-1, *([1] * (value.dim() - 1)))
    return torch.where(keep, null.to(device=value.device, dtype=value.dtype).expand_as(value), value)


class PipelineConditioning:
    """One family's pipeline conditioning (see the module docstring). Subclasses set the class
    attributes and implement the methods that raise here.

    * ``text_keys``: the transformer keywords the caption gives, per sample.
    """

    text_keys: Tuple[str, ...] = ()

    # -- text ----------------------------------------------------------------------------------
    def max_sequence_length(self, pipe) -> int:
        """The caption tokens ``__call__`` encodes by default."""
        return int(call_default(pipe, "max_sequence_length"))

    def text_tokens(self, pipe) -> int:
        """The caption tokens the transformer receives (SD3: its CLIP tokens too)."""
        return self.max_sequence_length(pipe)

    def encode_text(self, pipe, prompts: Sequence[str]) -> Dict[str, torch.Tensor]:
        """Captions -> the per-sample text inputs [B, ...] by transformer keyword."""
        raise NotImplementedError

    def encode_prompt(self, pipe, prompts: Sequence[str], *args, **kwargs):
        """``pipe.encode_prompt`` of ``prompts`` on the pipeline's device, at ``__call__``'s caption length;
        ``args`` / ``kwargs``: the other arguments ``__call__`` passes it."""
        return pipe.encode_prompt(list(prompts), *args, device=pipe._execution_device,
                                  max_sequence_length=self.max_sequence_length(pipe), **kwargs)

    # -- sizes ---------------------------------------------------------------------------------
    def frame_ratio(self, pipe) -> int:
        """Pixel frames per latent frame (1 for an image model)."""
        raise NotImplementedError

    def pixel_ratio(self, pipe) -> int:
        """Pixel rows (and columns) per latent row."""
        raise NotImplementedError

    def latent_frames(self, pipe, frames: int) -> int:
        """Latent frames of a ``frames``-frame clip (the causal video VAEs: the first frame alone)."""
        return (frames - 1) // self.frame_ratio(pipe) + 1

    # -- the step ------------------------------------------------------------------------------
    def shift(self, pipe, x_shape: Sequence[int], model_config: Mapping) -> float:
        """The time shift (SNR shift for v-prediction) for latent clips of ``x_shape`` (B, C, T, h, w)."""
        raise NotImplementedError

    def guided(self, model_config: Mapping) -> bool:
        """Whether the transformer embeds a guidance value (a guidance-distilled model)."""
        return False

    def expert_boundary(self, pipe) -> Optional[float]:
        """The timestep at and above which a pipeline of two experts runs ``transformer``, below it
        ``transformer_2`` (``models.experts.runs_high_noise``); None: one transformer."""
        return None

    def constants(self, pipe, model_config: Mapping, guidance: Optional[float]) -> Dict[str, Any]:
        """The inputs that do not depend on the sample; ``guidance``: a guidance value that replaces
        the pipeline's default ``guidance_scale`` (guidance-distilled models only)."""
        return {}

    def inputs(self, model_config: Mapping, constants: Mapping, x: torch.Tensor, t: torch.Tensor,
               text: Mapping[str, torch.Tensor]) -> Dict[str, Any]:
        """x [B, C, T, h, w], t [B], text inputs -> the transformer's keyword arguments."""
        raise NotImplementedError

    def prediction(self, out: torch.Tensor, x: torch.Tensor, model_config: Mapping,
                   constants: Mapping) -> torch.Tensor:
        """The transformer's output -> [B, C, T, h, w]."""
        return out


class ImageConditioning(PipelineConditioning):
    """An image model's pipeline: 1-frame clips, its VAE's ``vae_scale_factor`` pixels per latent row."""

    def frame_ratio(self, pipe) -> int:
        return 1

    def pixel_ratio(self, pipe) -> int:
        return int(pipe.vae_scale_factor)
