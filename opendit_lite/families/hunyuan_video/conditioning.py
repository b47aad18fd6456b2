"""What ``HunyuanVideoPipeline`` feeds HunyuanVideo's transformer, for training on the same inputs:
the caption wrapped in its prompt template and encoded by Llama (the third-to-last hidden state,
the template's tokens cropped, 256 tokens with a float mask), CLIP-L's pooled output of the caption,
the guidance embedding's value x 1000 (``__call__``'s ``guidance_scale``, 6, unless
``model.guidance``), the timestep ``sigma x 1000``; the scheduler's flow shift.
"""

import torch

from ..conditioning_base import PipelineConditioning, call_default, flow_shift


class HunyuanVideoConditioning(PipelineConditioning):
    text_keys = ("encoder_hidden_states", "encoder_attention_mask", "pooled_projections")

    def encode_text(self, pipe, prompts):
        states, pooled, mask = self.encode_prompt(pipe, prompts, prompt_2=None,
                                                  prompt_template=call_default(pipe, "prompt_template"))
        return {"encoder_hidden_states": states, "encoder_attention_mask": mask,   # [B, 256, W], [B, 256]
                "pooled_projections": pooled}                                       # [B, P]

    def frame_ratio(self, pipe):
        return int(pipe.vae_scale_factor_temporal)

    def pixel_ratio(self, pipe):
        return int(pipe.vae_scale_factor_spatial)

    def shift(self, pipe, x_shape, model_config):
        B, C, T, H, W = x_shape
        p = int(model_config["patch_size"])
        return flow_shift(pipe.scheduler.config, T * (H // p) * (W // p))

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        import numpy as np

        # as HunyuanVideoPipeline.__call__: its own sigmas 1 .. 1/N, the flow shift in the scheduler's config
        return {"sigmas": np.linspace(1.0, 0.0, steps + 1)[:-1]}

    def guided(self, model_config):
        return bool(model_config.get("guidance_embeds"))

    def constants(self, pipe, model_config, guidance):
        return {"guidance": call_default(pipe, "guidance_scale") if guidance is None else guidance}

    def inputs(self, model_config, constants, x, t, text):
        B = x.shape[0]
        # HunyuanVideoPipeline: the mask in the transformer's dtype, guidance_scale x 1000 per sample.
        guidance = torch.tensor([constants["guidance"]] * B, dtype=x.dtype, device=x.device) * 1000.0
        return dict(hidden_states=x, timestep=t.to(x.dtype), encoder_hidden_states=text["encoder_hidden_states"],
                    encoder_attention_mask=text["encoder_attention_mask"].to(x.dtype),
                    pooled_projections=text["pooled_projections"], guidance=guidance)


CONDITIONING = HunyuanVideoConditioning()
