"""Fused AdaLN in diffusers' ``FluxTransformer2DModel`` (FLUX.1).

* ``FluxTransformerBlock`` (double stream): ``norm1`` / ``norm1_context`` are ``AdaLayerNormZero``
  (fused through ``norms.py``), and each stream's attention residual feeds ``norm2`` /
  ``norm2_context`` with the feed-forward's modulation: that pair runs as one gated-residual kernel
  (``residual.residual_feed_forward``). The forward is rebound to diffusers' computation with those
  two calls; an IP-adapter's third attention output is added after the feed-forward as there.
* ``FluxSingleTransformerBlock``: its ``norm`` is an ``AdaLayerNormZeroSingle`` (``norms.py``); the
  block's residual is followed by the next block's norm, so it stays as it is.
* ``norm_out``: ``AdaLayerNormContinuous`` (``norms.py``).
"""

import torch
import torch.nn as nn

from ..adaln_protocol import register_adaln_block, register_adaln_model
from ..class_swap import swap_class
from ..foreign import is_exactly
from .norms import fuse_child_norms, is_fusable_norm
from .residual import residual_feed_forward

MODULE = "diffusers.models.transformers.transformer_flux"
NORMS = ("norm1", "norm1_context", "norm2", "norm2_context")


def is_flux_block(module: nn.Module) -> bool:
    return is_exactly(module, MODULE, "FluxTransformerBlock") and all(
        is_fusable_norm(getattr(module, name, None)) for name in NORMS)


class FusedFluxTransformerBlock:
    """``FluxTransformerBlock.forward`` with the gated residual + norm2 of each stream fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        # hidden_states: [B, N, D] image tokens; encoder_hidden_states: [B, M, D] text tokens; temb: [B, D].
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
            encoder_hidden_states, emb=temb)
        attention_outputs = self.attn(hidden_states=norm_hidden_states,
                                      encoder_hidden_states=norm_encoder_hidden_states,
                                      image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
        attn_output, context_attn_output = attention_outputs[:2]                  # [B, N, D], [B, M, D]

        hidden_states = residual_feed_forward(self.norm2, self.ff, hidden_states, attn_output,
                                              gate_msa, shift_mlp, scale_mlp, gate_mlp)           # [B, N, D]
        if len(attention_outputs) == 3:  # an IP-adapter's image-prompt attention
            hidden_states = hidden_states + attention_outputs[2]
        encoder_hidden_states = residual_feed_forward(self.norm2_context, self.ff_context, encoder_hidden_states,
                                                      context_attn_output, c_gate_msa, c_shift_mlp, c_scale_mlp,
                                                      c_gate_mlp)                                 # [B, M, D]
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states


def _convert(block: nn.Module) -> nn.Module:
    return swap_class(fuse_child_norms(block, NORMS), FusedFluxTransformerBlock)


register_adaln_block("diffusers FluxTransformerBlock", is_flux_block, _convert)
register_adaln_model(
    MODULE, "FluxTransformer2DModel",
    fused="double blocks: AdaLayerNormZero of both streams, attention residual + norm2 + modulation of both "
          "streams (gated-residual kernel); single blocks: AdaLayerNormZeroSingle; norm_out: AdaLayerNormContinuous",
    left=("each block's last residual (the feed-forward's, the single block's): the next norm is in the next block",))
