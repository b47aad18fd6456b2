"""What ``LTXPipeline`` feeds LTX-Video's transformer, for training on the same inputs: T5 states over
``__call__``'s 128 tokens, unmasked (padding states kept) with their bool mask, the latents packed by
its ``_pack_latents``, the latent grid, the timestep ``sigma x 1000`` and the rope interpolation
scale (temporal compression / its 25 fps frame rate, spatial compression twice); the token-count
flow shift of its scheduler (``calculate_shift`` over the latent positions).
"""

from ..conditioning_base import PipelineConditioning, call_default, flow_mu, flow_shift


class LTXVideoConditioning(PipelineConditioning):
    text_keys = ("encoder_hidden_states", "encoder_attention_mask")
    cfg_branches = "batched"       # one call on [negative prompts; prompts]

    def encode_text(self, pipe, prompts):
        states, mask, _, _ = self.encode_prompt(pipe, prompts, do_classifier_free_guidance=False)
        return {"encoder_hidden_states": states, "encoder_attention_mask": mask}    # [B, 128, W], [B, 128]

    def frame_ratio(self, pipe):
        return int(pipe.vae_temporal_compression_ratio)

    def pixel_ratio(self, pipe):
        return int(pipe.vae_spatial_compression_ratio)

    def shift(self, pipe, x_shape, model_config):
        B, C, T, H, W = x_shape
        return flow_shift(pipe.scheduler.config, T * H * W)      # LTXPipeline's video_sequence_length

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        import numpy as np

        c = pipe.scheduler.config  # as LTXPipeline.__call__: its own sigmas, mu from the latent video's tokens
        B, C, T, H, W = x_shape
        return {"sigmas": np.linspace(1.0, 1 / steps, steps), "mu": flow_mu(c, T * H * W)}

    def constants(self, pipe, model_config, guidance):
        frame_rate = call_default(pipe, "frame_rate")
        return {"rope_interpolation_scale": (pipe.vae_temporal_compression_ratio / frame_rate,
                                             pipe.vae_spatial_compression_ratio, pipe.vae_spatial_compression_ratio)}

    def inputs(self, model_config, constants, x, t, text):
        from diffusers import LTXPipeline

        B, C, T, H, W = x.shape
        p, pt = int(model_config["patch_size"]), int(model_config["patch_size_t"])
        return dict(hidden_states=LTXPipeline._pack_latents(x, p, pt),                 # [B, N, C pt p p]
                    encoder_hidden_states=text["encoder_hidden_states"], timestep=t,
                    encoder_attention_mask=text["encoder_attention_mask"], num_frames=T, height=H, width=W,
                    rope_interpolation_scale=constants["rope_interpolation_scale"])

    def prediction(self, out, x, model_config, constants):
        from diffusers import LTXPipeline

        B, C, T, H, W = x.shape
        p, pt = int(model_config["patch_size"]), int(model_config["patch_size_t"])
        return LTXPipeline._unpack_latents(out, T, H, W, p, pt)                         # [B, C, T, h, w]


CONDITIONING = LTXVideoConditioning()
