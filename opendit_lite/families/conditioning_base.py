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

Image-conditioned pipelines (image-to-video, edit; a family's ``variants``) also declare what their
conditioning images are and how they reach the transformer:

* ``image_input``: what a data row's ``image`` column gives: ``"none"`` (a text-only pipeline; a
  conditioning image is refused), ``"first_frame"`` (image-to-video: the training clip's own first
  frame as loaded, same resize and crop, unless the row's ``image`` names a file),
  ``"first_last_frames"`` (first-and-last-frame-to-video: the clip's own first and last frames, unless
  the row names both files, ``first|last``) or ``"reference"`` (edit: required, up to ``max_images``
  per row, each resized as the pipeline resizes it: ``reference_size``);
* ``for_model(model_config)``: the conditioning a pipeline class uses for the transformer it holds,
  where one class runs several layouts that take different images (``WanImageToVideoPipeline`` with
  Wan 2.1 FLF2V's transformer: a first and a last frame); itself by default;
* ``encode_images(pipe, images, clip_shape)``: each sample's conditioning images -> the per-sample
  inputs they give (``image_keys``: the condition latents and mask channels, CLIP image states, the
  packed reference latents), through the pipeline's own ``encode_image`` / ``prepare_latents`` /
  packing helpers; they are stored with the text inputs (the latents route) and reach ``inputs`` in
  the same mapping. Caption dropout replaces the text inputs only: the pipeline's unconditional
  branch sees the same image. Where the pipeline encodes the caption with the image (Qwen-Image-Edit's
  vision-language prompt), ``encode_text`` takes the images and ``null_text_per_image`` says the
  unconditional text is encoded per sample with its images (stored as ``null_text_key(key)``);
* ``loss_mask(model_config, constants, x)``: where the loss counts, when the pipeline keeps some
  latents as given (Wan 2.2 TI2V's first frame); tokens the transformer sees but the pipeline does not
  denoise (the reference tokens of an edit model) are cut by ``prediction`` instead;
* ``planned_tokens(height, width)``: the tokens the images add to a sample (the reference's on the
  sequence axis, the vision tokens in the text), which the memory planner counts with the target's.

Sampling through the pipeline with classifier-free guidance (``sample.cfg_scale``, ``sample.cfg_parallel``):

* ``guidance_call(scale, guided)``: the keywords of ``__call__`` that sample at that scale (most:
  ``guidance_scale``; true CFG beside a guidance embedding: Qwen-Image's ``true_cfg_scale`` with its
  negative prompt);
* ``cfg_branches``: how ``__call__`` runs guidance's conditional and unconditional branches, so that
  CFG-parallel ranks can each run one (``CFG_BRANCHES``): ``"batched"`` (one transformer call per step
  on the two branches' rows stacked, B + B), ``"two_calls"`` (two calls per step on the same latents, the
  first call's output only held until the second returns), None (not declared: CFG-parallel is refused).

Nothing here imports diffusers at import time.
"""

import inspect
import math
import os
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
    return math.exp(flow_mu(c, tokens, max_shift_default))


def flow_mu(scheduler_config: Mapping, tokens: int, max_shift_default: float = 1.15) -> float:
    """The ``mu`` a pipeline passes its dynamically shifting scheduler for ``tokens`` latent tokens:
    diffusers' ``calculate_shift`` (the same function in every flow pipeline's module) on the scheduler's
    config, with the defaults the pipelines give it (SD3's ``max_shift`` default is 1.16)."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    c = scheduler_config
    return calculate_shift(tokens, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                           c.get("base_shift", 0.5), c.get("max_shift", max_shift_default))


def rows_where(drop: torch.Tensor, null: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` [B, ...] with the rows where ``drop`` [B] is true replaced by ``null`` [1, ...]."""
    keep = drop.view(-1, *([1] * (value.dim() - 1)))
    return torch.where(keep, null.to(device=value.device, dtype=value.dtype).expand_as(value), value)


IMAGE_INPUTS = ("none", "first_frame", "first_last_frames", "reference")
CFG_BRANCHES = ("batched", "two_calls")
NULL_PREFIX = "null."


def null_text_key(key: str) -> str:
    """The key under which a sample's own unconditional text input ``key`` is stored (``null_text_per_image``)."""
    return NULL_PREFIX + key


class PipelineConditioning:
    """One family's pipeline conditioning (see the module docstring). Subclasses set the class
    attributes and implement the methods that raise here.

    * ``text_keys``: the transformer keywords the caption gives, per sample;
    * ``image_input``, ``max_images``, ``image_keys``, ``null_text_per_image``: its conditioning images
      (module docstring).
    """

    text_keys: Tuple[str, ...] = ()
    image_input: str = "none"            # one of IMAGE_INPUTS
    max_images: int = 0                  # conditioning images per sample the pipeline takes
    image_keys: Tuple[str, ...] = ()     # the per-sample inputs ``encode_images`` gives
    null_text_per_image: bool = False    # the caption (and the unconditional text) is encoded with the images
    null_prompt: str = ""                # what the pipeline's unconditional branch encodes (its negative prompt)
    unguided_scale: float = 1.0          # the ``guidance_scale`` at which the pipeline runs no unconditional branch
    cfg_branches: Optional[str] = None   # how ``__call__`` runs guidance's two branches: one of CFG_BRANCHES
    # Released folders (repository names, as ``huggingface-cli download`` writes them) of models distilled from
    # classifier-free guidance without a guidance input, whose files do not say so (Z-Image-Turbo's classes and
    # configs are the base model's): ``guidance_free``'s default where ``model.guidance_distilled`` is not set.
    distilled_releases: Tuple[str, ...] = ()

    def for_model(self, model_config: Mapping) -> "PipelineConditioning":
        """The conditioning of this pipeline class for a transformer of ``model_config`` (module docstring)."""
        return self

    # -- text ----------------------------------------------------------------------------------
    def max_sequence_length(self, pipe) -> int:
        """The caption tokens ``__call__`` encodes by default."""
        return int(call_default(pipe, "max_sequence_length"))

    def text_tokens(self, pipe) -> int:
        """The caption tokens the transformer receives (SD3: its CLIP tokens too)."""
        return self.max_sequence_length(pipe)

    def encode_text(self, pipe, prompts: Sequence[str]) -> Dict[str, torch.Tensor]:
        """Captions -> the per-sample text inputs [B, ...] by transformer keyword. A conditioning whose
        pipeline encodes the caption with the image (``null_text_per_image``) takes ``images`` too
        (as ``encode_images``)."""
        raise NotImplementedError

    def encode_text_and_null(self, pipe, prompts: Sequence[str], images) -> Tuple[Dict[str, torch.Tensor],
                                                                                Dict[str, torch.Tensor]]:
        """(``encode_text`` of the captions, of the null prompt) with each sample's ``images``, [B, ...] each: the
        text and null text of a ``null_text_per_image`` conditioning. One whose two encodings share work (the
        images' part of the prompt) overrides it."""
        return (self.encode_text(pipe, list(prompts), images),
                self.encode_text(pipe, [self.null_prompt] * len(prompts), images))

    # -- conditioning images -------------------------------------------------------------------
    def reference_size(self, pipe, height: int, width: int) -> Tuple[int, int]:
        """The (height, width) the pipeline resizes a ``height x width`` reference image to (edit models;
        image-to-video takes the clip's own size)."""
        return height, width

    def encode_images(self, pipe, images: Sequence[Sequence[torch.Tensor]],
                      clip_shape: Tuple[int, int, int]) -> Dict[str, torch.Tensor]:
        """Each sample's conditioning images (a list of [3, H, W] in [-1, 1], already at the size the
        pipeline resizes them to) and the target's pixel size (frames, height, width) -> the per-sample
        inputs [B, ...] they give, by ``image_keys``."""
        if self.image_input == "none":
            return {}
        raise NotImplementedError

    def planned_tokens(self, height: int, width: int) -> Tuple[int, int]:
        """(sequence tokens, text tokens) one sample of a ``height x width`` target (latent rows and columns)
        brings beyond the target's own tokens and the caption's, for the memory planner, at the released
        pipeline's sizes (no folder is read): an edit model's reference image packed on the sequence axis (one
        reference, of the target's aspect ratio), the vision tokens a vision-language prompt holds. (0, 0):
        nothing more."""
        return 0, 0

    def call_images(self, images: Sequence[Any]) -> Dict[str, Any]:
        """One prompt's conditioning images (PIL images, as the user gives them) -> the keywords of the
        pipeline's ``__call__`` that take them."""
        return {"image": images[0] if len(images) == 1 else list(images)}

    def call_size(self, height: int, width: int) -> Dict[str, Any]:
        """The keywords ``__call__`` takes beyond ``height`` / ``width`` to render a ``height x width`` target
        at that size ({} for most; FluxKontextPipeline: ``max_area``, else it renders about a megapixel)."""
        return {}

    def loss_mask(self, model_config: Mapping, constants: Mapping, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Where the loss counts for latent clips x [B, C, T, h, w]: a 0/1 tensor broadcastable to x, or
        None (everywhere)."""
        return None

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

    def set_timesteps_kwargs(self, pipe, steps: int, x_shape: Sequence[int],
                             model_config: Mapping) -> Optional[Dict[str, Any]]:
        """The keyword arguments (besides ``num_inference_steps``) the pipeline's ``__call__`` gives its
        scheduler's ``set_timesteps`` for ``steps`` steps on latent clips of ``x_shape`` (B, C, T, h, w):
        its custom ``sigmas``, the dynamic shift's ``mu``. None: not declared (a distillation of the
        pipeline, which samples its student with the scheduler, is refused)."""
        return None

    def guided(self, model_config: Mapping) -> bool:
        """Whether the transformer embeds a guidance value (a guidance-distilled model)."""
        return False

    def guidance_free(self, folder: str, declared: Optional[bool] = None) -> str:
        """Why the model in the pipeline folder ``folder`` samples without classifier-free guidance (a
        few-step model distilled from it, whose pipeline class is the guided one's), or "" when it uses
        the pipeline's guidance. Such a folder is sampled at ``unguided_scale`` and refuses another.
        ``declared`` (``model.guidance_distilled``) decides when set; otherwise a folder named as one of
        ``distilled_releases`` (a path component, ``_`` read as ``-``, any case) is one."""
        if declared is not None:
            return ("model.guidance_distilled is true: the model is distilled from classifier-free guidance and "
                    f"samples at guidance_scale {self.unguided_scale:g} (no unconditional branch)") if declared else ""
        parts = {p.lower().replace("_", "-") for p in os.path.normpath(os.path.abspath(folder)).split(os.sep)}
        name = next((n for n in self.distilled_releases if n.lower() in parts), None)
        return "" if name is None else (f"{name} is distilled from classifier-free guidance: it samples in a few "
                                        f"steps at guidance_scale {self.unguided_scale:g} (no unconditional branch; "
                                        f"model.guidance_distilled=false if this folder is not it)")

    def guidance_call(self, scale: float, guided: bool) -> Dict[str, Any]:
        """The keywords of ``__call__`` that sample at guidance ``scale`` (``guided``: the transformer embeds
        it, a guidance-distilled model)."""
        return {"guidance_scale": scale}

    def runs_unconditional(self, scale: float) -> bool:
        """Whether ``__call__`` at classifier-free guidance ``scale`` runs the unconditional branch."""
        return scale > self.unguided_scale

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
