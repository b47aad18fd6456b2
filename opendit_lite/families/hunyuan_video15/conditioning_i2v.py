"""What ``HunyuanVideo15ImageToVideoPipeline`` feeds HunyuanVideo 1.5's transformer, for training on the
same inputs (``image_input="first_frame"``: the training clip's first frame is the conditioning image):

* the caption as the text-to-video pipeline encodes it (``conditioning.py``);
* ``image_keys``: the image's latents (``_get_image_latents``: the VAE's mode x scaling_factor,
  [B, C, 1, h, w]) and SigLIP's states of it (``encode_image``, [B, N, image_embed_dim]), each
  through the pipeline's own helper, from the image as the pipeline receives it (a PIL image);
* ``hidden_states``: the latents, then the condition latents (the image's in frame 0, zero after)
  and the mask channel (1 on frame 0), as ``prepare_cond_latents_and_mask`` lays them out;
* ``timestep_r=None``: a checkpoint distilled with MeanFlow (``use_meanflow``) takes the next sampling
  time there, a pair of times the flow-matching objective does not draw: refused.

Caption dropout replaces the text inputs only: the pipeline's unconditional branch sees the same image.
"""

import torch

from ...errors import ConfigError
from .conditioning import HunyuanVideo15Conditioning


def _pil(pipe, image: torch.Tensor):
    """[3, H, W] in [-1, 1] -> the PIL image the pipeline takes (its processor's own conversion)."""
    return pipe.video_processor.postprocess(image[None].float().cpu(), output_type="pil")[0]


class HunyuanVideo15ImageToVideoConditioning(HunyuanVideo15Conditioning):
    image_input = "first_frame"
    max_images = 1
    image_keys = ("image_latents", "image_embeds")

    def constants(self, pipe, model_config, guidance):
        if model_config.get("use_meanflow"):
            raise ConfigError("this HunyuanVideo 1.5 transformer is distilled with MeanFlow (use_meanflow=true): its "
                              "pipeline feeds it the next sampling time as timestep_r, which flow-matching training "
                              "does not draw. Fine-tune a checkpoint without use_meanflow (the non-distilled "
                              "image-to-video release).")
        return {}

    def encode_images(self, pipe, images, clip_shape):
        frames, height, width = clip_shape
        device = pipe._execution_device
        pils = [_pil(pipe, sample[0]) for sample in images]
        # One image at a time: AutoencoderKLHunyuanVideo15.encode fails on a batch of more than one (diffusers 0.42.1).
        latents = torch.cat([pipe._get_image_latents(pipe.vae, pipe.video_processor, image, height, width, device)
                             for image in pils])                                               # [B, C, 1, h, w]
        dtype = next(pipe.image_encoder.parameters()).dtype
        embeds = torch.cat([pipe.encode_image(image=image, batch_size=1, device=device, dtype=dtype)
                            for image in pils])                                                # [B, N, Wi]
        return {"image_latents": latents, "image_embeds": embeds}

    def inputs(self, model_config, constants, x, t, text):
        B, C, T, h, w = x.shape
        # prepare_cond_latents_and_mask: the image's latents on frame 0, zero after; the mask 1 on frame 0
        hidden = torch.cat([x, x.new_zeros(B, C + 1, T, h, w)], dim=1)                         # [B, 2C + 1, T, h, w]
        hidden[:, C:2 * C, :1] = text["image_latents"].to(x.dtype)                             # the image on frame 0
        hidden[:, 2 * C, 0] = 1.0                                                              # the mask channel
        return dict(hidden_states=hidden, timestep=t.to(x.dtype),
                    timestep_r=None, image_embeds=text["image_embeds"].to(x.dtype), **self.text_inputs(x, text))


CONDITIONING = HunyuanVideo15ImageToVideoConditioning()
