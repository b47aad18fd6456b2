"""What ``WanPipeline`` feeds Wan's transformer(s), for training on the same inputs: UMT5 states of
the cleaned caption cut at its length and zero-padded to ``__call__``'s 512 tokens (no mask), the
clip as it is, the timestep ``sigma x 1000`` (per token with ``expand_timesteps``, Wan 2.2 TI2V); the
flow shift of its UniPC scheduler. Wan 2.2 A14B holds two experts: ``transformer`` for timesteps at
or above ``boundary_ratio x num_train_timesteps`` (high noise), ``transformer_2`` below
(``expert_boundary``; the routing: ``models.experts.NoiseExperts``).
"""

from ..conditioning_base import PipelineConditioning


class WanConditioning(PipelineConditioning):
    text_keys = ("encoder_hidden_states",)
    cfg_branches = "two_calls"     # the prompts' call, then the negative prompts', on the same latents

    def encode_text(self, pipe, prompts):
        states, _ = self.encode_prompt(pipe, prompts, do_classifier_free_guidance=False)
        return {"encoder_hidden_states": states}                                   # [B, 512, W]

    def frame_ratio(self, pipe):
        return int(pipe.vae_scale_factor_temporal)

    def pixel_ratio(self, pipe):
        return int(pipe.vae_scale_factor_spatial)

    def shift(self, pipe, x_shape, model_config):
        c = pipe.scheduler.config
        return float(c["flow_shift"] if "flow_shift" in c else c.get("shift", 1.0))

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        return {}  # WanPipeline: scheduler.set_timesteps(num_inference_steps), the flow shift in its config

    def constants(self, pipe, model_config, guidance):
        return {"expand_timesteps": bool(pipe.config.get("expand_timesteps"))}

    def expert_boundary(self, pipe):
        boundary = pipe.config.get("boundary_ratio")  # as WanPipeline.__call__ computes its boundary_timestep
        return None if boundary is None else boundary * pipe.scheduler.config.num_train_timesteps

    def inputs(self, model_config, constants, x, t, text):
        timestep = t                                                                # [B]
        if constants["expand_timesteps"]:  # one timestep per token of the 2x2 patch grid, as WanPipeline builds it
            B, _, T, H, W = x.shape
            timestep = t[:, None].expand(B, T * len(range(0, H, 2)) * len(range(0, W, 2)))  # [B, N]
        return dict(hidden_states=x, timestep=timestep, encoder_hidden_states=text["encoder_hidden_states"])


CONDITIONING = WanConditioning()
