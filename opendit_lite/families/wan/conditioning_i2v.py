"""What ``WanImageToVideoPipeline`` feeds Wan's transformer(s), for training image-to-video on the same
inputs; the text as ``WanPipeline`` encodes it (``conditioning.py``), the image as ``__call__`` does,
through the pipeline's own ``prepare_latents`` and ``encode_image``. Three released layouts:

* Wan 2.1 I2V (480P / 720P): the transformer takes 36 channels, the noisy latents [B, 16, T, h, w]
  followed by the condition ``prepare_latents`` returns, [B, 20, T, h, w]: 4 mask channels (the first
  pixel frame given, as the VAE's 4 frames per latent frame) and the normalised latents of the clip
  whose first frame is the image and the rest black. The image also reaches the cross-attention as
  CLIP states (``encoder_hidden_states_image``: the image encoder's second to last hidden states,
  [B, 257, 1280]; the transformer's ``image_dim`` says it takes them);
* Wan 2.2 I2V-A14B: the same 36 channels, no image encoder (``encoder_hidden_states_image`` None), two
  experts split at ``boundary_ratio`` as in ``WanPipeline``;
* Wan 2.2 TI2V-5B (``expand_timesteps``): the 48-channel latents of the image alone, [B, 48, 1, h, w],
  replace the first latent frame of the noisy latents, and each token gets its own timestep, zero on
  the first frame's tokens. The pipeline keeps that frame as given, so the loss leaves it out
  (``loss_mask``);
* Wan 2.1 FLF2V (its transformer's ``pos_embed_seq_len``: a position embedding over two images' CLIP
  states): ``__call__(image=first, last_image=last)``. The condition is the clip of the first frame,
  black frames and the last frame, the mask 1 on the first and last pixel frames; the CLIP states
  are both images', [2B, 257, 1280] (each sample's first then last: the transformer views them as
  [B, 514, 1280] before adding its position embedding). ``WanFirstLastFrameConditioning``, which
  ``for_model`` picks for such a transformer; the images are the clip's first and last frames
  (``image_input = "first_last_frames"``) unless a row names both files.

The image is the training clip's first frame (``image_input = "first_frame"``) at the clip's size;
the CLIP image processor resizes and crops it as the pipeline does a user's image (the pipeline gives
CLIP the image as passed, the VAE the image resized to the video: the same picture when the image has
the video's size). Caption dropout replaces the text only: the pipeline's negative branch sees the
same image.
"""

from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch

from ...errors import ConfigError
from .conditioning import WanConditioning

CONDITION = "condition"                             # the condition latents (and mask channels), per sample
IMAGE_STATES = "encoder_hidden_states_image"        # Wan 2.1's CLIP image states, per sample


def clean_prompts_without_ftfy() -> None:
    """diffusers 0.42.1's ``pipeline_wan_i2v`` cleans prompts with ``ftfy.fix_text`` without checking that
    ftfy is installed (it imports ftfy only where it is; ``WanPipeline``'s module checks before each use),
    so without ftfy every prompt fails with a NameError. Where ftfy is missing, the module gets
    ``WanPipeline``'s ``basic_clean``, which skips ftfy as that module does and is otherwise the same
    (HTML unescaping, stripping): the prompt text ``WanPipeline`` encodes. With ftfy installed nothing
    changes. Idempotent."""
    from diffusers.pipelines.wan import pipeline_wan, pipeline_wan_i2v
    from diffusers.utils import is_ftfy_available

    if not is_ftfy_available():
        pipeline_wan_i2v.basic_clean = pipeline_wan.basic_clean


def takes_image_states(pipe) -> bool:
    """Whether ``pipe`` feeds its transformer CLIP image states: as ``__call__`` decides, by its
    transformer's ``image_dim`` (Wan 2.1 I2V); a pipeline loaded without transformers (training's
    encoders) by whether it holds an image encoder."""
    transformer = getattr(pipe, "transformer", None)
    if transformer is not None:
        return transformer.config.image_dim is not None
    return getattr(pipe, "image_encoder", None) is not None


def first_frame_mask(x: torch.Tensor) -> torch.Tensor:
    """TI2V's mask for latent clips x [B, C, T, h, w]: [1, 1, T, h, w], 0 on the first latent frame (the
    given image), 1 elsewhere, as ``WanImageToVideoPipeline.prepare_latents`` builds it."""
    _, _, T, h, w = x.shape
    mask = torch.ones(1, 1, T, h, w, dtype=x.dtype, device=x.device)
    mask[:, :, 0] = 0
    return mask


class WanImageToVideoConditioning(WanConditioning):
    image_input = "first_frame"
    max_images = 1
    # encode_images gives the keys its layout uses: CONDITION always, IMAGE_STATES for Wan 2.1 only.
    image_keys = (CONDITION, IMAGE_STATES)

    def encode_text(self, pipe, prompts):
        clean_prompts_without_ftfy()
        return super().encode_text(pipe, prompts)

    def encode_images(self, pipe, images: Sequence[Sequence[torch.Tensor]],
                      clip_shape: Tuple[int, int, int]) -> Dict[str, torch.Tensor]:
        frames, height, width = clip_shape
        if any(len(sample) != self.max_images for sample in images):
            raise ConfigError(f"this WanImageToVideoPipeline takes {self.max_images} image(s) per video "
                              f"({self.image_input.replace('_', ' ')}); got {[len(s) for s in images]} images per "
                              f"sample.")
        device = pipe._execution_device
        samples = [[image.float() for image in sample] for sample in images]              # B x n x [3, H, W]
        conditions = []
        for sample in samples:  # one sample at a time: prepare_latents repeats one image over its batch
            latents = torch.zeros(1, pipe.vae.config.z_dim, self.latent_frames(pipe, frames),  # not used: no draw
                                  height // self.pixel_ratio(pipe), width // self.pixel_ratio(pipe), device=device)
            last = sample[1][None].to(device) if len(sample) > 1 else None                # FLF2V's last_image
            out = pipe.prepare_latents(sample[0][None].to(device), 1, pipe.vae.config.z_dim, height, width, frames,
                                       torch.float32, device, None, latents, last)
            conditions.append(out[1])       # [1, 20, T, h, w]; expand_timesteps: the image's latents [1, C, 1, h, w]
        inputs = {CONDITION: torch.cat(conditions)}
        if takes_image_states(pipe):
            # The pipeline gives CLIP the images as pictures: the frames back as 8-bit RGB (its own postprocess),
            # one encode_image call per sample as __call__ makes one ([image] or [image, last_image]).
            states = [pipe.encode_image(self._pictures(pipe, sample), device) for sample in samples]  # n x [257, W]
            inputs[IMAGE_STATES] = torch.stack(states) if len(samples[0]) > 1 else torch.cat(states)
        return inputs                                         # IMAGE_STATES: [B, 257, W_clip]; FLF2V [B, 2, 257, W]

    @staticmethod
    def _pictures(pipe, sample: Sequence[torch.Tensor]):
        pictures = [pipe.video_processor.postprocess(image[None].cpu(), output_type="pil")[0] for image in sample]
        return pictures[0] if len(pictures) == 1 else pictures

    def for_model(self, model_config):
        """Wan 2.1 FLF2V's transformer (``pos_embed_seq_len``) takes a first and a last frame; the others one."""
        return FLF2V_CONDITIONING if model_config.get("pos_embed_seq_len") else CONDITIONING

    def constants(self, pipe, model_config, guidance):
        """Wan's, after the refusals of a transformer this conditioning cannot feed (before any step)."""
        if self.for_model(model_config) is not self:  # a caller that skipped for_model: the other layout's images
            raise ValueError(f"{type(self).__name__} does not feed this transformer (pos_embed_seq_len="
                             f"{model_config.get('pos_embed_seq_len')}): use for_model(config)'s conditioning")
        if model_config.get("image_dim") is not None and getattr(pipe, "image_encoder", None) is None:
            raise ConfigError("the transformer takes CLIP image states (image_dim is set, Wan 2.1 I2V) but the "
                              "pipeline folder holds no image_encoder: use the release's whole folder.")
        return super().constants(pipe, model_config, guidance)

    def inputs(self, model_config, constants, x, t, text):
        inputs = super().inputs(model_config, constants, x, t, text)
        condition = text[CONDITION]
        if constants["expand_timesteps"]:  # TI2V: the given first frame in place, its tokens at time 0
            mask = first_frame_mask(x)                                                     # [1, 1, T, h, w]
            inputs["hidden_states"] = (1 - mask) * condition.to(x.dtype) + mask * x        # [B, C, T, h, w]
            per_token = mask[0, 0][:, ::2, ::2].flatten()  # the 2x2 patch grid, as __call__ reads the mask
            inputs["timestep"] = per_token[None] * t[:, None]                              # [B, N]
        else:
            inputs["hidden_states"] = torch.cat([x, condition.to(x.dtype)], dim=1)        # [B, 16 + 20, T, h, w]
        inputs[IMAGE_STATES] = text.get(IMAGE_STATES) if model_config.get("image_dim") is not None else None
        return inputs

    def call_images(self, images):
        clean_prompts_without_ftfy()  # the pipeline's own __call__ (sampling) cleans prompts too
        if self.image_input == "first_last_frames":
            first, last = images
            return {"image": first, "last_image": last}
        return super().call_images(images)

    def loss_mask(self, model_config: Mapping, constants: Mapping, x: torch.Tensor) -> Optional[torch.Tensor]:
        if not constants["expand_timesteps"]:
            return None  # every latent frame is denoised (the image enters as extra channels)
        return first_frame_mask(x)[:, :, :, :1, :1]                                        # [1, 1, T, 1, 1]


class WanFirstLastFrameConditioning(WanImageToVideoConditioning):
    """Wan 2.1 FLF2V: ``__call__(image=first, last_image=last)`` (module docstring)."""

    image_input = "first_last_frames"
    max_images = 2

    def inputs(self, model_config, constants, x, t, text):
        inputs = super().inputs(model_config, constants, x, t, text)
        states = inputs[IMAGE_STATES]                                                     # [B, 2, 257, W]
        # each sample's first then last image's states as rows, as __call__ passes them: [2B, 257, W]
        inputs[IMAGE_STATES] = None if states is None else states.flatten(0, 1)
        return inputs


CONDITIONING = WanImageToVideoConditioning()
FLF2V_CONDITIONING = WanFirstLastFrameConditioning()
