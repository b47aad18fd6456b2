"""Fused AdaLN in diffusers' ``Flux2TransformerBlock`` and ``Flux2SingleTransformerBlock`` (FLUX.2).

FLUX.2 modulates inline: the model computes the shift / scale / gate chunks once per forward
(``double_stream_modulation_img`` / ``_txt``, ``single_stream_modulation``: [B, 1, D] each after
``Flux2Modulation.split``) and every block applies them to affine-free LayerNorms, the form the kernels
take:

* ``Flux2TransformerBlock`` (double stream): ``norm1`` / ``norm1_context`` + modulation before the joint
  attention (``norm_modulate``), and on each stream the attention's gated residual feeding ``norm2`` /
  ``norm2_context`` + the feed-forward's modulation as one gated-residual kernel
  (``residual_norm_modulate``); the feed-forward's gated residual stays (the next block's norm follows);
* ``Flux2SingleTransformerBlock``: ``norm`` + modulation before the fused attention-and-MLP
  (``norm_modulate``); its gated residual is followed by the next block's norm, so it stays;
* ``norm_out``: ``AdaLayerNormContinuous`` (``diffusers_norms``, every model).

The forwards are diffusers' computation with those calls (the text split of the single block, fp16
clipping and the attention keywords as there); parameters and state-dict keys are unchanged.
"""

import torch

from ...converter.adaln_protocol import norm_modulate, residual_norm_modulate
from ...converter.diffusers_family_blocks import DOUBLE_STREAM_NORMS, FusedBlock, FusedNorms

MODULE = "diffusers.models.transformers.transformer_flux2"


def _split(mod: torch.Tensor, sets: int):
    """``Flux2Modulation.split``: [B, 3 sets D] or [B, 1, 3 sets D] -> sets x (shift, scale, gate) [B, 1, D]."""
    from diffusers.models.transformers.transformer_flux2 import Flux2Modulation

    return Flux2Modulation.split(mod, sets)


class FusedFlux2TransformerBlock:
    """``Flux2TransformerBlock.forward`` with norm1 / norm1_context + modulation and each stream's gated
    residual + norm2 + modulation fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb_mod_img, temb_mod_txt, image_rotary_emb=None,
                joint_attention_kwargs=None):
        # hidden_states: [B, N, D]; encoder_hidden_states: [B, M, D]; temb_mod_*: [B, 6D]
        (shift_msa, scale_msa, gate_msa), (shift_mlp, scale_mlp, gate_mlp) = _split(temb_mod_img, 2)
        (c_shift_msa, c_scale_msa, c_gate_msa), (c_shift_mlp, c_scale_mlp, c_gate_mlp) = _split(temb_mod_txt, 2)

        norm_hidden_states = norm_modulate(self.norm1, hidden_states, shift_msa, scale_msa)              # [B, N, D]
        norm_encoder_hidden_states = norm_modulate(self.norm1_context, encoder_hidden_states,
                                                   c_shift_msa, c_scale_msa)                              # [B, M, D]
        attn_output, context_attn_output = self.attn(
            hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
            image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))

        hidden_states, norm_hidden_states = residual_norm_modulate(
            self.norm2, hidden_states, attn_output, gate_msa, shift_mlp, scale_mlp)                       # [B, N, D]
        hidden_states = hidden_states + gate_mlp * self.ff(norm_hidden_states)

        encoder_hidden_states, norm_encoder_hidden_states = residual_norm_modulate(
            self.norm2_context, encoder_hidden_states, context_attn_output, c_gate_msa, c_shift_mlp, c_scale_mlp)
        encoder_hidden_states = encoder_hidden_states + c_gate_mlp * self.ff_context(norm_encoder_hidden_states)
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states


class FusedFlux2SingleTransformerBlock:
    """``Flux2SingleTransformerBlock.forward`` with norm + modulation fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb_mod, image_rotary_emb=None,
                joint_attention_kwargs=None, split_hidden_states=False, text_seq_len=None):
        if encoder_hidden_states is not None:  # else the text is already first in hidden_states
            text_seq_len = encoder_hidden_states.shape[1]
            hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)                     # [B, M + N, D]
        mod_shift, mod_scale, mod_gate = _split(temb_mod, 1)[0]
        norm_hidden_states = norm_modulate(self.norm, hidden_states, mod_shift, mod_scale)
        attn_output = self.attn(hidden_states=norm_hidden_states, image_rotary_emb=image_rotary_emb,
                                **(joint_attention_kwargs or {}))
        hidden_states = hidden_states + mod_gate * attn_output
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        if split_hidden_states:
            return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]
        return hidden_states


FUSED_NORMS = FusedNorms(
    blocks=(FusedBlock(MODULE, "Flux2TransformerBlock", DOUBLE_STREAM_NORMS, FusedFlux2TransformerBlock),
            FusedBlock(MODULE, "Flux2SingleTransformerBlock", ("norm",), FusedFlux2SingleTransformerBlock)),
    fused="double blocks: norm1 and norm1_context with their modulation, attention residual + norm2 + modulation "
          "of both streams (gated-residual kernel); single blocks: norm with its modulation; norm_out: "
          "AdaLayerNormContinuous",
    left=("each block's last residual (the feed-forward's, the single block's): the next norm is in the next block",))
