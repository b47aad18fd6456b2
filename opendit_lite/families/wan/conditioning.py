"""What ``WanPipeline`` feeds Wan's transformer(s), for training on the same inputs: UMT5 states of
the cleaned caption cut at its length and zero-padded to ``__call__``'s 512 tokens (no mask), the
clip as it is, the timestep ``sigma x 1000`` (per token with ``expand_timesteps``, Wan 2.2 TI2V); the
flow shift of its UniPC scheduler. Wan 2.2 A14B holds two experts: ``transformer`` for timesteps at
or above ``boundary_ratio x 1000`` (high noise), ``transformer_2`` below (``expert``).
"""

from ..conditioning_base import PipelineConditioning


class WanConditioning(PipelineConditioning):
    pipelines = ("WanPipeline",)
    text_keys = ("encoder_hidden_states",)

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

    def constants(self, pipe, model_config, guidance):
        boundary = pipe.config.get("boundary_ratio")
        return {"expand_timesteps": bool(pipe.config.get("expand_timesteps")),
                "boundary_timestep": None if boundary is None else
                boundary * pipe.scheduler.config.num_train_timesteps}

    def expert(self, constants, timestep: float) -> str:
        """The expert ``WanPipeline`` denoises at ``timestep`` with (its ``transformer`` for Wan 2.1)."""
        boundary = constants["boundary_timestep"]
        return "transformer" if boundary is None or timestep >= boundary else "transformer_2"

    def inputs(self, model_config, constants, x, t, text):
        timestep = t                                                                # [B]
        if constants["expand_timesteps"]:  # one timestep per token of the 2x2 patch grid, as WanPipeline builds it
            B, _, T, H, W = x.shape
            timestep = t[:, None].expand(B, T * len(range(0, H, 2)) * len(range(0, W, 2)))  # [B, N]
        return dict(hidden_states=x, timestep=timestep, encoder_hidden_states=text["encoder_hidden_states"])


CONDITIONING = WanConditioning()
