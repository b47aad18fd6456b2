"""Fused AdaLN in diffusers' ``FluxTransformer2DModel`` (FLUX.1).

* ``FluxTransformerBlock`` (double stream): ``norm1`` / ``norm1_context`` are ``AdaLayerNormZero``
  (fused through ``diffusers_norms``), and each stream's attention residual feeds ``norm2`` /
  ``norm2_context`` with the feed-forward's modulation: that pair runs as one gated-residual kernel
  (``diffusers_family_blocks.double_stream_forward``). The forward is diffusers' computation with those calls; an
  IP-adapter's third attention output is added to the image stream after its feed-forward, as there.
* ``FluxSingleTransformerBlock``: its ``norm`` is an ``AdaLayerNormZeroSingle`` (``diffusers_norms``); the
  block's residual is followed by the next block's norm, so it stays as it is.
* ``norm_out``: ``AdaLayerNormContinuous`` (``diffusers_norms``).
"""

import torch

from ...converter.diffusers_family_blocks import (
    DOUBLE_AND_SINGLE_STREAM_FUSED,
    DOUBLE_STREAM_NORMS,
    FusedBlock,
    FusedNorms,
    double_stream_forward,
)

MODULE = "diffusers.models.transformers.transformer_flux"


class FusedFluxTransformerBlock:
    """``FluxTransformerBlock.forward`` with the gated residual + norm2 of each stream fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        def attend(norm_hidden_states, norm_encoder_hidden_states):
            return self.attn(hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
                             image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))

        hidden_states, encoder_hidden_states, ip_adapter = double_stream_forward(
            self, hidden_states, encoder_hidden_states, temb, attend)              # [B, N, D], [B, M, D]
        if ip_adapter:  # the image-prompt attention's output joins the image stream
            hidden_states = hidden_states + ip_adapter[0]
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states


FUSED_NORMS = FusedNorms(
    blocks=(FusedBlock(MODULE, "FluxTransformerBlock", DOUBLE_STREAM_NORMS, FusedFluxTransformerBlock),),
    fused=DOUBLE_AND_SINGLE_STREAM_FUSED,
    left=("each block's last residual (the feed-forward's, the single block's): the next norm is in the next block",))
