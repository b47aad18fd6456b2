"""Fused AdaLN in diffusers' ``CogVideoXTransformer3DModel`` (CogVideoX 1.0 / 1.5).

* ``CogVideoXBlock``: ``norm1`` and ``norm2`` are ``CogVideoXLayerNormZero``: one LayerNorm *with*
  weight and bias, modulated separately for the video and the text stream. ``norm1`` is fused
  through ``diffusers_norms`` (the kernel folds the norm's affine into the modulation). The attention
  residual of each stream feeds ``norm2``, so the block's forward is rebound (``class_swap``) to
  diffusers' computation with each residual + ``norm2`` + modulation as one gated-residual kernel;
  the feed-forward runs on both streams at once as in diffusers.
* ``norm_out``: an ``AdaLayerNorm`` with ``chunk_dim=1`` (``diffusers_norms``).

Left: ``norm_final`` (an affine LayerNorm without modulation: ``fused_layernorm``'s kind) and the
feed-forward's residual, followed by the next block.
"""

import torch

from ...converter.adaln_protocol import residual_norm_modulate
from ...converter.diffusers_family_blocks import FusedBlock, FusedNorms
from ...converter.foreign_classes import is_exactly

MODULE = "diffusers.models.transformers.cogvideox_transformer_3d"


class FusedCogVideoXBlock:
    """``CogVideoXBlock.forward`` with each stream's attention residual + norm2 fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, attention_kwargs=None):
        # hidden_states: [B, N, D] video tokens; encoder_hidden_states: [B, M, D] text tokens; temb: [B, C].
        text_seq_length = encoder_hidden_states.size(1)
        norm_hidden_states, norm_encoder_hidden_states, gate_msa, enc_gate_msa = self.norm1(
            hidden_states, encoder_hidden_states, temb)
        attn_hidden_states, attn_encoder_hidden_states = self.attn1(
            hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
            image_rotary_emb=image_rotary_emb, **(attention_kwargs or {}))

        # norm2's modulation, applied with each stream's residual in one pass.
        norm2 = self.norm2
        shift, scale, gate_ff, enc_shift, enc_scale, enc_gate_ff = norm2.linear(norm2.silu(temb)).chunk(6, dim=1)
        hidden_states, norm_hidden_states = residual_norm_modulate(
            norm2.norm, hidden_states, attn_hidden_states, gate_msa, shift, scale)               # 2 x [B, N, D]
        encoder_hidden_states, norm_encoder_hidden_states = residual_norm_modulate(
            norm2.norm, encoder_hidden_states, attn_encoder_hidden_states, enc_gate_msa, enc_shift,
            enc_scale)                                                                           # 2 x [B, M, D]

        ff_output = self.ff(torch.cat([norm_encoder_hidden_states, norm_hidden_states], dim=1))  # [B, M + N, D]
        hidden_states = hidden_states + gate_ff[:, None, :] * ff_output[:, text_seq_length:]
        encoder_hidden_states = encoder_hidden_states + enc_gate_ff[:, None, :] * ff_output[:, :text_seq_length]
        return hidden_states, encoder_hidden_states


def _norm2_is_diffusers(block) -> bool:
    """The rebound forward reads norm2's modulation itself: norm2 must be diffusers' CogVideoXLayerNormZero."""
    return is_exactly(block.norm2, "diffusers.models.normalization", "CogVideoXLayerNormZero")


FUSED_NORMS = FusedNorms(
    blocks=(FusedBlock(MODULE, "CogVideoXBlock", ("norm1", "norm2"), FusedCogVideoXBlock, fits=_norm2_is_diffusers),),
    fused="blocks: CogVideoXLayerNormZero of both streams (the norm's affine folded into the modulation), "
          "attention residual + norm2 + modulation of both streams (gated-residual kernel); norm_out: AdaLayerNorm",
    left=("norm_final: an affine LayerNorm without modulation (fused_layernorm's kind)",
          "the feed-forward's residual: the next norm is in the next block"))
