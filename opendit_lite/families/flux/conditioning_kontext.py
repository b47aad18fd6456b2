"""What ``FluxKontextPipeline`` (FLUX.1 Kontext, an edit model on Flux's transformer) feeds the transformer,
for training on the same inputs. The caption, the timestep sigma, the guidance value and the flow shift are
Flux's (``conditioning.py``: the same ``encode_prompt``, and ``calculate_shift`` over the target's packed
tokens only); what Kontext adds is one reference image per sample:

* ``reference_size``: ``__call__`` resizes the reference (``_auto_resize``, its default) to the entry of
  ``PREFERRED_KONTEXT_RESOLUTIONS`` closest in aspect ratio to the image's size (that size first floored by its
  image processor to a multiple of the VAE's factor x 2), then floors that entry to the same multiple. The table
  is read from diffusers' module when asked, so the rule stays the pipeline's.
* ``encode_images``: the resized reference through the pipeline's own ``prepare_latents`` (its VAE's mode,
  ``(z - shift) x scale``, packed in 2x2 patches) -> the packed reference latents and their ids
  (``_prepare_latent_image_ids`` with the first coordinate 1: Kontext tells the reference from the target by it).
* ``inputs``: ``hidden_states`` are the target's packed tokens then the reference's, on the sequence axis, and
  ``img_ids`` the target's ids then the reference's, as ``__call__`` concatenates them before the transformer.
* ``prediction``: the transformer's output over the target's tokens only (``__call__`` keeps
  ``noise_pred[:, :target tokens]``): the loss covers the target, never the reference.

The guidance default is ``__call__``'s ``guidance_scale`` (3.5 in diffusers 0.42.1; the Kontext model card
samples with 2.5: set ``model.guidance`` to train at that value). Caption dropout feeds the unconditional
branch's inputs: the empty prompt with the same reference (true CFG with ``negative_prompt=""``).

The target renders at about one megapixel in ``__call__`` unless ``max_area`` is given: ``call_size`` gives it, so
that sampling renders the asked size.
"""

from typing import Dict, Mapping, Sequence, Tuple

import torch

from ...errors import ConfigError
from .conditioning import FluxConditioning

REFERENCE_LATENTS = "reference_latents"   # [B, N_ref, 4C] the packed reference latents
REFERENCE_IDS = "reference_ids"           # [B, N_ref, 3] their rotary ids (first coordinate 1)
RELEASED_PIXELS_PER_TOKEN = 16            # FLUX.1 Kontext dev's VAE (8x fewer rows), then its 2x2 packing


def preferred_resolutions():
    """diffusers' ``PREFERRED_KONTEXT_RESOLUTIONS`` ((width, height) pairs), read when called."""
    from diffusers.pipelines.flux import pipeline_flux_kontext

    return pipeline_flux_kontext.PREFERRED_KONTEXT_RESOLUTIONS


def preferred_size(aspect_ratio: float, multiple_of: int) -> Tuple[int, int]:
    """(height, width): the preferred resolution closest to ``aspect_ratio`` (width / height), floored to
    ``multiple_of``, as ``__call__`` picks it."""
    _, width, height = min((abs(aspect_ratio - w / h), w, h) for w, h in preferred_resolutions())
    return height // multiple_of * multiple_of, width // multiple_of * multiple_of


class FluxKontextConditioning(FluxConditioning):
    image_input = "reference"
    max_images = 1
    image_keys = (REFERENCE_LATENTS, REFERENCE_IDS)

    def reference_size(self, pipe, height: int, width: int) -> Tuple[int, int]:
        multiple_of = int(pipe.vae_scale_factor) * 2
        height, width = pipe.image_processor.get_default_height_width(None, height, width)  # floored to multiple_of
        if not height or not width:
            raise ConfigError(f"a reference image is smaller than {multiple_of} pixels on a side, the least "
                              f"FluxKontextPipeline resizes from; give a larger image.")
        return preferred_size(width / height, multiple_of)

    def planned_tokens(self, height: int, width: int) -> Tuple[int, int]:
        """The reference's packed tokens on the sequence axis: its preferred resolution (about a megapixel) at the
        target's aspect ratio, in the release's 16-pixel tokens; the caption is Flux's."""
        rows, columns = preferred_size(width / height, RELEASED_PIXELS_PER_TOKEN)
        return (rows // RELEASED_PIXELS_PER_TOKEN) * (columns // RELEASED_PIXELS_PER_TOKEN), 0

    def call_size(self, height: int, width: int) -> Dict[str, int]:
        """``max_area`` = height x width: ``__call__`` then renders the asked ``height x width`` (its size for
        ``max_area`` and that aspect ratio, floored to a multiple of 16 in the release), not about one megapixel."""
        return {"max_area": height * width}

    def encode_images(self, pipe, images: Sequence[Sequence[torch.Tensor]],
                      clip_shape: Tuple[int, int, int]) -> Dict[str, torch.Tensor]:
        _, height, width = clip_shape
        device, dtype = pipe._execution_device, pipe.vae.dtype
        latents, ids = [], []
        for sample in images:
            if len(sample) != self.max_images:
                raise ConfigError(f"FluxKontextPipeline takes exactly one reference image per sample; a sample "
                                  f"came with {len(sample)}. Give one image in the data's `image` column per row.")
            image = sample[0][None].to(device=device, dtype=dtype)                              # [1, 3, H, W]
            # ``latents`` given (an empty placeholder): the target's noise is not drawn, the global RNG untouched.
            _, packed, _, image_ids = pipe.prepare_latents(image, 1, pipe.latent_channels, height, width, dtype,
                                                           device, None, torch.empty(0))
            latents.append(packed)                                                              # [1, N_ref, 4C]
            ids.append(image_ids[None])                                                         # [1, N_ref, 3]
        sizes = sorted({tuple(t.shape[1:]) for t in latents})
        if len(sizes) > 1:
            raise ConfigError(f"the reference images of one batch come out at different sizes ({sizes}: packed "
                              f"tokens x channels): FluxKontextPipeline resizes each reference to the preferred "
                              f"resolution closest to its aspect ratio, and references of different sizes cannot "
                              f"share a batch. Give references of one aspect ratio, or one sample per batch: "
                              f"global_batch_size equal to the data-parallel ranks (scripts/extract_latents.py: "
                              f"--batch-size 1).")
        return {REFERENCE_LATENTS: torch.cat(latents), REFERENCE_IDS: torch.cat(ids)}

    def inputs(self, model_config: Mapping, constants: Mapping, x: torch.Tensor, t: torch.Tensor,
               text: Mapping[str, torch.Tensor]):
        inputs = super().inputs(model_config, constants, x, t, text)
        reference = text[REFERENCE_LATENTS].to(device=x.device, dtype=x.dtype)                  # [B, N_ref, 4C]
        reference_ids = text[REFERENCE_IDS][0].to(device=x.device, dtype=x.dtype)               # [N_ref, 3]
        inputs["hidden_states"] = torch.cat([inputs["hidden_states"], reference], dim=1)         # [B, N + N_ref, 4C]
        inputs["img_ids"] = torch.cat([inputs["img_ids"], reference_ids], dim=0)                 # [N + N_ref, 3]
        return inputs

    def prediction(self, out: torch.Tensor, x: torch.Tensor, model_config: Mapping,
                   constants: Mapping) -> torch.Tensor:
        H, W = x.shape[-2:]
        return super().prediction(out[:, : (H // 2) * (W // 2)], x, model_config, constants)    # the target's tokens


CONDITIONING = FluxKontextConditioning()
