"""What ``Flux2Pipeline`` (FLUX.2 [dev], text to image) feeds its transformer, for training on the same
inputs: the Mistral 3 text encoder's hidden states at ``__call__``'s ``text_encoder_out_layers`` (10, 20
and 30) stacked per token into one state of three widths, over its 512 padded chat-template tokens
(system message, then the caption), unmasked; text ids (0, 0, 0, l) from its ``_prepare_text_ids``; the
latents as the pipeline denoises them (the VAE's 2x2 patches, normalised by its BatchNorm statistics:
``encoding.py``) as tokens by its ``_pack_latents`` with the ids (0, row, column, 0) of its
``_prepare_latent_ids``; the timestep sigma (the transformer multiplies it by 1000); the guidance value
(``__call__``'s ``guidance_scale``, 4.0, unless ``model.guidance``).

The pipeline has no negative prompt: a prompt of None is encoded as the empty prompt, which caption
dropout trains on. Its time shift is not diffusers' ``calculate_shift``: ``__call__`` hands its
scheduler ``mu = compute_empirical_mu(tokens, num_inference_steps)`` (FLUX.2's fit over the token
count and the step count), so training shifts by ``exp(mu)`` at ``__call__``'s default step count.
Conditioning images (``image=``: FLUX.2's multi-reference editing) are not trained here.
"""

import math

import torch

from ...errors import ConfigError
from ..conditioning_base import ImageConditioning, call_default
from .adapter import rotary_ids


class Flux2Conditioning(ImageConditioning):
    text_keys = ("encoder_hidden_states",)

    def encode_text(self, pipe, prompts):
        states, _ = self.encode_prompt(pipe, prompts,
                                       text_encoder_out_layers=tuple(call_default(pipe, "text_encoder_out_layers")))
        return {"encoder_hidden_states": states}                                    # [B, 512, 3W]

    def pixel_ratio(self, pipe):
        return int(pipe.vae_scale_factor) * 2                                       # the VAE, then its 2x2 patches

    def shift(self, pipe, x_shape, model_config):
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        B, C, T, H, W = x_shape
        c = pipe.scheduler.config
        if not c.get("use_dynamic_shifting"):
            return float(c.get("shift", 1.0))
        if c.get("time_shift_type", "exponential") != "exponential":
            raise ConfigError(f"the pipeline's scheduler shifts times with time_shift_type={c['time_shift_type']!r}; "
                              f"training reproduces the exponential shift only.")
        mu = compute_empirical_mu(image_seq_len=H * W, num_steps=int(call_default(pipe, "num_inference_steps")))
        return math.exp(mu)

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        import numpy as np
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        # as Flux2Pipeline.__call__: its own sigmas (none on flow sigmas), mu from the token count and the steps
        B, C, T, H, W = x_shape
        sigmas = None if pipe.scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        return {"mu": compute_empirical_mu(image_seq_len=H * W, num_steps=steps),
                **({} if sigmas is None else {"sigmas": sigmas})}

    def guided(self, model_config):
        return bool(model_config.get("guidance_embeds"))

    def constants(self, pipe, model_config, guidance):
        return {"guidance": call_default(pipe, "guidance_scale") if guidance is None else guidance}

    def inputs(self, model_config, constants, x, t, text):
        from diffusers import Flux2Pipeline

        B = x.shape[0]
        latents = x[:, :, 0]                                                        # [B, C, h, w]
        states = text["encoder_hidden_states"]                                      # [B, M, 3W]
        guidance = None
        if model_config.get("guidance_embeds"):
            guidance = torch.full([1], constants["guidance"], device=x.device, dtype=torch.float32).expand(B)
        txt_ids, img_ids = rotary_ids(B, states.shape[1], *latents.shape[-2:], x.device)  # [B, M, 4], [B, hw, 4]
        return dict(hidden_states=Flux2Pipeline._pack_latents(latents),               # [B, hw, C]
                    timestep=t / 1000, guidance=guidance, encoder_hidden_states=states,
                    txt_ids=txt_ids, img_ids=img_ids)

    def prediction(self, out, x, model_config, constants):
        B, C, T, h, w = x.shape
        return out.transpose(1, 2).reshape(B, C, 1, h, w)                           # [B, hw, C] -> [B, C, 1, h, w]


CONDITIONING = Flux2Conditioning()
