"""What ``FluxPipeline`` feeds Flux's transformer, for training on the same inputs: T5 states over
``__call__``'s 512 tokens, unmasked (padding states kept), CLIP-L's pooled output, zero text ids,
the latents packed in 2x2 patches by its ``_pack_latents`` with the ids of
``_prepare_latent_image_ids``, the timestep sigma (not x 1000), and for guidance-distilled (dev)
models the guidance value (``__call__``'s ``guidance_scale``, 3.5, unless ``model.guidance``); the
token-count flow shift of its scheduler (``calculate_shift`` over the packed tokens).
"""

import torch

from ..conditioning_base import ImageConditioning, call_default, flow_mu, flow_shift


class FluxConditioning(ImageConditioning):
    text_keys = ("encoder_hidden_states", "pooled_projections")

    def encode_text(self, pipe, prompts):
        states, pooled, _ = self.encode_prompt(pipe, prompts, prompt_2=None)
        return {"encoder_hidden_states": states, "pooled_projections": pooled}      # [B, 512, W], [B, P]

    def shift(self, pipe, x_shape, model_config):
        B, C, T, H, W = x_shape
        return flow_shift(pipe.scheduler.config, (H // 2) * (W // 2))                 # the packed tokens

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        import numpy as np

        c = pipe.scheduler.config  # as FluxPipeline.__call__: its own sigmas, mu from the packed token count
        B, C, T, H, W = x_shape
        mu = flow_mu(c, (H // 2) * (W // 2))
        sigmas = None if c.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        return {"mu": mu, **({} if sigmas is None else {"sigmas": sigmas})}

    def guided(self, model_config):
        return bool(model_config.get("guidance_embeds"))

    def constants(self, pipe, model_config, guidance):
        return {"guidance": call_default(pipe, "guidance_scale") if guidance is None else guidance,
                "vae_scale_factor": int(pipe.vae_scale_factor)}

    def inputs(self, model_config, constants, x, t, text):
        from diffusers import FluxPipeline

        B, C, _, H, W = x.shape
        states = text["encoder_hidden_states"]
        guidance = None
        if model_config.get("guidance_embeds"):
            guidance = torch.full([1], constants["guidance"], device=x.device, dtype=torch.float32).expand(B)
        return dict(hidden_states=FluxPipeline._pack_latents(x[:, :, 0], B, C, H, W),   # [B, hw/4, 4C]
                    timestep=t / 1000, guidance=guidance, pooled_projections=text["pooled_projections"],
                    encoder_hidden_states=states,
                    txt_ids=torch.zeros(states.shape[1], 3, device=x.device, dtype=states.dtype),
                    img_ids=FluxPipeline._prepare_latent_image_ids(B, H // 2, W // 2, x.device, x.dtype))

    def prediction(self, out, x, model_config, constants):
        from diffusers import FluxPipeline

        scale = constants["vae_scale_factor"]
        H, W = x.shape[-2:]
        return FluxPipeline._unpack_latents(out, H * scale, W * scale, scale).unsqueeze(2)  # [B, C, 1, h, w]


CONDITIONING = FluxConditioning()
