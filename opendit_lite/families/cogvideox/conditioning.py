"""What ``CogVideoXPipeline`` feeds CogVideoX's transformer, for training on the same inputs: T5
states over ``__call__``'s 226 tokens, unmasked (padding states kept), the latents frame-major
[B, T, C, h, w], the integer DDPM step, and the 3-D rotary table its
``_prepare_rotary_positional_embeddings`` builds for the clip's pixel size; the scheduler's SNR shift.
Text-to-video passes no ``ofs``.
"""

from types import SimpleNamespace

from ..conditioning_base import PipelineConditioning


class CogVideoXConditioning(PipelineConditioning):
    text_keys = ("encoder_hidden_states",)
    cfg_branches = "batched"       # one call on [negative prompts; prompts]

    def encode_text(self, pipe, prompts):
        states, _ = self.encode_prompt(pipe, prompts, do_classifier_free_guidance=False)
        return {"encoder_hidden_states": states}                                   # [B, 226, W]

    def frame_ratio(self, pipe):
        return int(pipe.vae_scale_factor_temporal)

    def pixel_ratio(self, pipe):
        return int(pipe.vae_scale_factor_spatial)

    def shift(self, pipe, x_shape, model_config):
        return float(pipe.scheduler.config.get("snr_shift_scale", 1.0))

    def constants(self, pipe, model_config, guidance):
        return {"vae_scale_factor_spatial": int(pipe.vae_scale_factor_spatial)}

    def inputs(self, model_config, constants, x, t, text):
        from diffusers import CogVideoXPipeline

        B, C, T, H, W = x.shape
        rotary = None
        if model_config.get("use_rotary_positional_embeddings"):
            # The pipeline's own table for a clip of H x W latents (its pixel size) and T latent frames.
            scale = constants["vae_scale_factor_spatial"]
            pipe = SimpleNamespace(vae_scale_factor_spatial=scale, transformer=SimpleNamespace(config=model_config))
            rotary = CogVideoXPipeline._prepare_rotary_positional_embeddings(pipe, H * scale, W * scale, T, x.device)
        return dict(hidden_states=x.transpose(1, 2), encoder_hidden_states=text["encoder_hidden_states"],  # [B,T,C,h,w]
                    timestep=t.long(), image_rotary_emb=rotary)

    def prediction(self, out, x, model_config, constants):
        return out.transpose(1, 2)                                                  # [B, C, T, h, w]


CONDITIONING = CogVideoXConditioning()
