"""Fused AdaLN in diffusers' ``QwenImageTransformer2DModel`` (Qwen-Image).

``QwenImageTransformerBlock`` is a double-stream (MMDiT) block that modulates inline: ``img_mod`` /
``txt_mod`` give each stream six chunks (shift, scale, gate before attention; shift, scale, gate
before the feed-forward) for the affine-free LayerNorms ``img_norm1`` / ``txt_norm1`` and
``img_norm2`` / ``txt_norm2``. The conversion makes the four norms ``AdaLNLayerNorm`` and rebinds the
forward (``class_swap``) to diffusers' computation with each stream's norm1 + modulation as one
kernel and its attention residual + norm2 + modulation as the gated-residual kernel
(``residual_feed_forward``); parameters and state-dict keys are unchanged.

Left: blocks of ``zero_cond_t`` models (Qwen-Image-Edit-2511), whose image modulation is chosen per
token (the target's and the references' timesteps) by ``modulate_index``; the feed-forward's gated
residual, followed by the next block's norm; ``norm_out`` (an ``AdaLayerNormContinuous``: fused by
``diffusers_norms``).
"""

import torch

from ...converter.adaln_protocol import norm_modulate
from ...converter.diffusers_family_blocks import FusedBlock, FusedNorms, residual_feed_forward

MODULE = "diffusers.models.transformers.transformer_qwenimage"
NORMS = ("img_norm1", "img_norm2", "txt_norm1", "txt_norm2")


class FusedQwenImageTransformerBlock:
    """``QwenImageTransformerBlock.forward`` with each stream's two modulated norms fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb, image_rotary_emb=None,
                joint_attention_kwargs=None, modulate_index=None):
        # hidden_states: [B, N, D] image tokens; encoder_hidden_states: [B, M, D] text tokens; temb: [B, D].
        img_shift1, img_scale1, img_gate1, img_shift2, img_scale2, img_gate2 = self.img_mod(temb).chunk(6, dim=-1)
        txt_shift1, txt_scale1, txt_gate1, txt_shift2, txt_scale2, txt_gate2 = self.txt_mod(temb).chunk(6, dim=-1)

        img_modulated = norm_modulate(self.img_norm1, hidden_states, img_shift1.unsqueeze(1),
                                      img_scale1.unsqueeze(1))                                # [B, N, D]
        txt_modulated = norm_modulate(self.txt_norm1, encoder_hidden_states, txt_shift1.unsqueeze(1),
                                      txt_scale1.unsqueeze(1))                                # [B, M, D]
        img_attn_output, txt_attn_output = self.attn(
            hidden_states=img_modulated, encoder_hidden_states=txt_modulated,
            encoder_hidden_states_mask=encoder_hidden_states_mask, image_rotary_emb=image_rotary_emb,
            **(joint_attention_kwargs or {}))

        hidden_states = residual_feed_forward(self.img_norm2, self.img_mlp, hidden_states, img_attn_output,
                                              img_gate1, img_shift2, img_scale2, img_gate2)   # [B, N, D]
        encoder_hidden_states = residual_feed_forward(self.txt_norm2, self.txt_mlp, encoder_hidden_states,
                                                      txt_attn_output, txt_gate1, txt_shift2, txt_scale2,
                                                      txt_gate2)                              # [B, M, D]
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states


def _per_sample_modulation(block) -> bool:
    return not getattr(block, "zero_cond_t", False)


FUSED_NORMS = FusedNorms(
    blocks=(FusedBlock(MODULE, "QwenImageTransformerBlock", NORMS, FusedQwenImageTransformerBlock,
                       _per_sample_modulation),),
    fused="blocks: img_norm1 / txt_norm1 with their modulation, attention residual + img_norm2 / txt_norm2 + "
          "modulation of both streams (gated-residual kernel); norm_out: AdaLayerNormContinuous",
    left=("blocks of zero_cond_t models (Qwen-Image-Edit-2511): the image modulation is chosen per token by "
          "modulate_index",
          "each stream's feed-forward residual: the next norm is in the next block"))
