"""Fused AdaLN in diffusers' ``SD3Transformer2DModel`` (SD3 and SD3.5; MMDiT).

* ``JointTransformerBlock``: ``norm1`` is an ``AdaLayerNormZero``, or in SD3.5's dual-attention
  layers an ``SD35AdaLayerNormZeroX`` (two modulations of one norm); ``norm1_context`` an
  ``AdaLayerNormZero``, or ``AdaLayerNormContinuous`` in the last block (``context_pre_only``).
  All are fused through ``diffusers_norms``. The residual that feeds ``norm2`` (and ``norm2_context``) runs
  with that norm and the feed-forward's modulation as one gated-residual kernel
  (``diffusers_family_blocks.residual_feed_forward``): the attention's residual, or in a dual-attention layer the
  second attention's (the first one's is followed by that residual, not by a norm, and stays).
  The last block returns no text stream, as in diffusers. Feed-forward chunking
  (``set_chunk_feed_forward``) is kept.
* ``norm_out``: ``AdaLayerNormContinuous`` (``diffusers_norms``).
"""

import functools

import torch.nn as nn

from ...converter.diffusers_family_blocks import FusedBlock, FusedNorms, residual_feed_forward


def _norm_names(block: nn.Module):
    return ("norm1", "norm1_context", "norm2") + (() if block.context_pre_only else ("norm2_context",))


def _feed_forward(block: nn.Module, ff: nn.Module):
    """``ff``, or its chunked application when the block was told to chunk its feed-forward."""
    if block._chunk_size is None:
        return ff
    from diffusers.models.attention import _chunked_feed_forward

    return functools.partial(_chunked_feed_forward, ff, chunk_dim=block._chunk_dim, chunk_size=block._chunk_size)


class FusedJointTransformerBlock:
    """``JointTransformerBlock.forward`` with the residual that feeds each norm2 fused with it."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb, joint_attention_kwargs=None):
        # hidden_states: [B, N, D] image tokens; encoder_hidden_states: [B, M, D] text tokens; temb: [B, D].
        joint_attention_kwargs = joint_attention_kwargs or {}
        if self.use_dual_attention:
            (norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm_hidden_states2,
             gate_msa2) = self.norm1(hidden_states, emb=temb)
        else:
            norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        if self.context_pre_only:
            norm_encoder_hidden_states = self.norm1_context(encoder_hidden_states, temb)
        else:
            norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
                encoder_hidden_states, emb=temb)
        attn_output, context_attn_output = self.attn(hidden_states=norm_hidden_states,
                                                     encoder_hidden_states=norm_encoder_hidden_states,
                                                     **joint_attention_kwargs)

        if self.use_dual_attention:  # the first residual is followed by the second attention's
            hidden_states = hidden_states + gate_msa.unsqueeze(1) * attn_output               # [B, N, D]
            attn_output, gate_msa = self.attn2(hidden_states=norm_hidden_states2, **joint_attention_kwargs), gate_msa2
        hidden_states = residual_feed_forward(self.norm2, _feed_forward(self, self.ff), hidden_states, attn_output,
                                              gate_msa, shift_mlp, scale_mlp, gate_mlp)       # [B, N, D]
        if self.context_pre_only:
            return None, hidden_states
        encoder_hidden_states = residual_feed_forward(self.norm2_context, _feed_forward(self, self.ff_context),
                                                      encoder_hidden_states, context_attn_output, c_gate_msa,
                                                      c_shift_mlp, c_scale_mlp, c_gate_mlp)   # [B, M, D]
        return encoder_hidden_states, hidden_states


FUSED_NORMS = FusedNorms(
    blocks=(FusedBlock("diffusers.models.attention", "JointTransformerBlock", _norm_names,
                       FusedJointTransformerBlock),),
    fused="joint blocks: AdaLayerNormZero / SD35AdaLayerNormZeroX (image) and AdaLayerNormZero / "
          "AdaLayerNormContinuous (text), the residual feeding norm2 + modulation of both streams (gated-residual "
          "kernel); norm_out: AdaLayerNormContinuous",
    left=("each block's feed-forward residual: the next norm is in the next block",
          "in SD3.5 dual-attention layers, the first attention's residual: followed by the second attention's "
          "residual, not by a norm"))
