"""What ``StableDiffusion3Pipeline`` feeds SD3's transformer, for training on the same inputs: the
second-to-last states of CLIP-L and CLIP-G (77 tokens, joined and zero-padded to T5's width)
followed by T5's over ``__call__``'s 256 tokens, unmasked: 333 tokens; the two CLIPs' projected
pooled outputs joined; the latents as images; the timestep ``sigma x 1000``; the scheduler's flow
shift (token-count shift where it shifts dynamically).
"""

from ..conditioning_base import ImageConditioning, flow_mu, flow_shift

CLIP_TOKENS = 77  # the CLIP encoders' positions, before T5's tokens


class SD3Conditioning(ImageConditioning):
    text_keys = ("encoder_hidden_states", "pooled_projections")
    cfg_branches = "batched"       # one call on [negative prompts; prompts]

    def text_tokens(self, pipe):
        return CLIP_TOKENS + self.max_sequence_length(pipe)

    def encode_text(self, pipe, prompts):
        states, _, pooled, _ = self.encode_prompt(pipe, prompts, None, None, do_classifier_free_guidance=False,
                                                  clip_skip=None)
        return {"encoder_hidden_states": states, "pooled_projections": pooled}      # [B, 333, W], [B, P]

    def shift(self, pipe, x_shape, model_config):
        B, C, T, H, W = x_shape
        p = int(model_config["patch_size"])
        return flow_shift(pipe.scheduler.config, (H // p) * (W // p), max_shift_default=1.16)

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        c = pipe.scheduler.config  # as StableDiffusion3Pipeline.__call__: no sigmas; mu only when it shifts dynamically
        if not c.get("use_dynamic_shifting"):
            return {}
        B, C, T, H, W = x_shape
        p = int(model_config["patch_size"])
        return {"mu": flow_mu(c, (H // p) * (W // p), max_shift_default=1.16)}

    def inputs(self, model_config, constants, x, t, text):
        return dict(hidden_states=x[:, :, 0], timestep=t, encoder_hidden_states=text["encoder_hidden_states"],
                    pooled_projections=text["pooled_projections"])                  # hidden [B, C, h, w]

    def prediction(self, out, x, model_config, constants):
        return out.unsqueeze(2)                                                     # [B, C, 1, h, w]


CONDITIONING = SD3Conditioning()
