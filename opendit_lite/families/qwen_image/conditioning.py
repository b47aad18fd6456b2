"""What ``QwenImagePipeline`` feeds Qwen-Image's transformer, for training on the same inputs: the
caption in its prompt template, encoded by Qwen2.5-VL (the last hidden state, the template's system
prefix, ``prompt_template_encode_start_idx`` tokens, dropped), at most ``__call__``'s 512 tokens, with
their key mask; the latents packed in 2x2 patches by its ``_pack_latents`` with their patch grid
(``img_shapes``), the timestep sigma (not x 1000); no guidance embedding; the token-count flow shift
of its scheduler (``calculate_shift`` over the packed tokens).

``encode_prompt`` gives a batch its longest caption's length, zero-padded, and the key mask only when
some caption is shorter (None otherwise). To store and batch captions of any length, ``encode_text``
pads each to the 512 tokens (states zero, mask 0) and ``inputs`` cuts the batch back to its longest
caption, giving the mask only when a caption is shorter, exactly as the pipeline calls its
transformer for that batch of captions. The negative prompt of true CFG is encoded the same way:
caption dropout trains on the encoded empty prompt (``negative_prompt=""``).
"""

import torch

from ..conditioning_base import ImageConditioning, flow_mu, flow_shift

# The transformer keywords the caption gives.
STATES, MASK = "encoder_hidden_states", "encoder_hidden_states_mask"


def padded_text(states: torch.Tensor, mask, tokens: int) -> dict:
    """``encode_prompt``'s (states [B, L, W], mask [B, L] or None) -> both zero-padded to ``tokens``."""
    B, L, _ = states.shape
    if mask is None:
        mask = torch.ones(B, L, dtype=torch.long, device=states.device)
    return {STATES: torch.nn.functional.pad(states, (0, 0, 0, tokens - L)),        # [B, tokens, W]
            MASK: torch.nn.functional.pad(mask, (0, tokens - L))}                  # [B, tokens]


def batch_text(text) -> dict:
    """Padded text inputs -> the batch's own: cut to its longest caption, the mask None when no caption is
    shorter (``encode_prompt`` for the same captions)."""
    lengths = text[MASK].sum(dim=1)                                                # [B]
    longest, shortest = torch.stack([lengths.max(), lengths.min()]).tolist()       # one host sync
    mask = text[MASK][:, :longest]
    return {STATES: text[STATES][:, :longest], MASK: None if shortest == longest else mask}


class QwenImageConditioning(ImageConditioning):
    text_keys = (STATES, MASK)
    cfg_branches = "two_calls"     # true CFG: the transformer once on the prompt, once on the negative prompt

    def guidance_call(self, scale, guided):
        # ``guidance_scale`` is the guidance embedding's, which the model lacks; true CFG runs only when
        # ``true_cfg_scale`` > 1 and a negative prompt is given (the empty prompt caption dropout trains on)
        if guided:
            return {"guidance_scale": scale}
        return {"true_cfg_scale": scale, **({"negative_prompt": self.null_prompt} if scale > 1 else {})}

    def encode_text(self, pipe, prompts):
        states, mask = self.encode_prompt(pipe, prompts)                           # [B, L, W], [B, L] | None
        return padded_text(states, mask, self.text_tokens(pipe))

    def shift(self, pipe, x_shape, model_config):
        B, C, T, H, W = x_shape
        return flow_shift(pipe.scheduler.config, (H // 2) * (W // 2))              # the packed tokens

    def set_timesteps_kwargs(self, pipe, steps, x_shape, model_config):
        import numpy as np

        c = pipe.scheduler.config  # as QwenImagePipeline.__call__: its own sigmas, mu from the packed token count
        B, C, T, H, W = x_shape
        return {"sigmas": np.linspace(1.0, 1 / steps, steps), "mu": flow_mu(c, (H // 2) * (W // 2))}

    def constants(self, pipe, model_config, guidance):
        return {"vae_scale_factor": int(pipe.vae_scale_factor)}

    def inputs(self, model_config, constants, x, t, text):
        from diffusers import QwenImagePipeline

        B, C, _, H, W = x.shape
        return dict(hidden_states=QwenImagePipeline._pack_latents(x[:, :, 0], B, C, H, W),  # [B, hw/4, 4C]
                    timestep=t / 1000, guidance=None, img_shapes=[[(1, H // 2, W // 2)]] * B,
                    **batch_text(text))

    def prediction(self, out, x, model_config, constants):
        from diffusers import QwenImagePipeline

        scale = constants["vae_scale_factor"]
        H, W = x.shape[-2:]
        return QwenImagePipeline._unpack_latents(out, H * scale, W * scale, scale)    # [B, C, 1, h, w]


CONDITIONING = QwenImageConditioning()
