"""What ``HunyuanVideo15Pipeline`` feeds HunyuanVideo 1.5's transformer, for training on the same inputs:

* the caption in Qwen2.5-VL's chat template with the pipeline's system message, padded to 1000 + 108
  tokens, the third-to-last hidden state with the template's first 108 tokens cropped
  (``encoder_hidden_states`` [B, 1000, W], ``encoder_attention_mask``);
* ByT5's states of the caption's quoted glyph text (``"..."`` or ``“...”``), 256 tokens, all zero and
  masked when it has none (``encoder_hidden_states_2``, ``encoder_attention_mask_2``);
* both through the pipeline's own ``encode_prompt`` (masks as floats, as it returns them), the empty
  prompt for the unconditional branch (its default negative prompt);
* ``image_embeds``: zeros [B, 729, image_embed_dim] (no image: the transformer masks them);
* ``hidden_states``: the latents with zero condition latents and a zero mask channel
  (``prepare_cond_latents_and_mask``), the timestep ``sigma x 1000``; no ``timestep_r``;
* the scheduler's flow shift. The model embeds no guidance value: guidance is classifier-free
  (the pipeline's ``guider``), whose unconditional branch caption dropout trains.
"""


from ..conditioning_base import PipelineConditioning, flow_shift
from .adapter import condition_channels

TEXT_KEYS = ("encoder_hidden_states", "encoder_attention_mask", "encoder_hidden_states_2", "encoder_attention_mask_2")


class HunyuanVideo15Conditioning(PipelineConditioning):
    text_keys = TEXT_KEYS
    cfg_branches = "two_calls"     # its guider's batches: the caption's, then the negative prompt's

    def max_sequence_length(self, pipe) -> int:
        return int(pipe.tokenizer_max_length)

    def text_tokens(self, pipe) -> int:
        # the joint stream: caption, glyph text and image tokens
        return int(pipe.tokenizer_max_length + pipe.tokenizer_2_max_length + pipe.vision_num_semantic_tokens)

    def encode_text(self, pipe, prompts):
        # __call__ passes the transformer's dtype, which the masks take too; a pipeline loaded without its
        # transformer keeps the text encoder's (``inputs`` casts the masks to the latents' dtype).
        dtype = pipe.transformer.dtype if getattr(pipe, "transformer", None) is not None else None
        states, mask, states_2, mask_2 = pipe.encode_prompt(prompt=list(prompts), device=pipe._execution_device,
                                                            dtype=dtype, batch_size=len(prompts))
        return {"encoder_hidden_states": states, "encoder_attention_mask": mask,        # [B, 1000, W], [B, 1000]
                "encoder_hidden_states_2": states_2, "encoder_attention_mask_2": mask_2}  # [B, 256, W2], [B, 256]

    def frame_ratio(self, pipe):
        return int(pipe.vae_scale_factor_temporal)

    def pixel_ratio(self, pipe):
        return int(pipe.vae_scale_factor_spatial)

    def shift(self, pipe, x_shape, model_config):
        B, C, T, H, W = x_shape
        pt, p = int(model_config["patch_size_t"]), int(model_config["patch_size"])
        return flow_shift(pipe.scheduler.config, (T // pt) * (H // p) * (W // p))

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        import numpy as np

        # as HunyuanVideo15Pipeline.__call__: its own sigmas 1 .. 1/N, the flow shift in the scheduler's config
        return {"sigmas": np.linspace(1.0, 0.0, steps + 1)[:-1]}

    def constants(self, pipe, model_config, guidance):
        return {"vision_tokens": int(pipe.vision_num_semantic_tokens)}

    def text_inputs(self, x, text):
        """The caption's inputs with the masks in the latents' dtype (the pipeline's transformer dtype)."""
        return dict(encoder_hidden_states=text["encoder_hidden_states"],
                    encoder_attention_mask=text["encoder_attention_mask"].to(x.dtype),
                    encoder_hidden_states_2=text["encoder_hidden_states_2"],
                    encoder_attention_mask_2=text["encoder_attention_mask_2"].to(x.dtype))

    def inputs(self, model_config, constants, x, t, text):
        B = x.shape[0]
        image_embeds = x.new_zeros(B, constants["vision_tokens"], int(model_config["image_embed_dim"]))
        return dict(hidden_states=condition_channels(x), image_embeds=image_embeds,       # [B, 2C + 1, T, h, w]
                    timestep=t.to(x.dtype), **self.text_inputs(x, text))


CONDITIONING = HunyuanVideo15Conditioning()
