"""Fused AdaLN in diffusers' ``HunyuanVideo15Transformer3DModel``.

* ``HunyuanVideo15TransformerBlock`` (double stream, the model's only block kind): ``norm1`` /
  ``norm1_context`` are ``AdaLayerNormZero`` (``diffusers_norms``); each stream's attention residual and
  ``norm2`` / ``norm2_context`` with the feed-forward's modulation run as one gated-residual kernel
  (``diffusers_family_blocks.double_stream_forward``): the block's forward is HunyuanVideo 1.0's.
* ``norm_out``: ``AdaLayerNormContinuous`` (``diffusers_norms``).

Left: the token refiner's blocks (affine LayerNorms without modulation: ``fused_layernorm``'s kind,
and gates only), the ByT5 and image projections' LayerNorms (no modulation), and each block's last
residual (the next norm is in the next block).
"""

from ...converter.diffusers_family_blocks import (
    DOUBLE_STREAM_NORMS,
    FusedBlock,
    FusedNorms,
    double_stream_forward,
)

MODULE = "diffusers.models.transformers.transformer_hunyuan_video15"


class FusedHunyuanVideo15TransformerBlock:
    """``HunyuanVideo15TransformerBlock.forward`` with the gated residual + norm2 of each stream fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb, attention_mask=None, freqs_cis=None,
                *args, **kwargs):
        def attend(norm_hidden_states, norm_encoder_hidden_states):
            return self.attn(hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
                             attention_mask=attention_mask, image_rotary_emb=freqs_cis)

        hidden_states, encoder_hidden_states, _ = double_stream_forward(
            self, hidden_states, encoder_hidden_states, temb, attend)              # [B, N, D], [B, M, D]
        return hidden_states, encoder_hidden_states


FUSED_NORMS = FusedNorms(
    blocks=(FusedBlock(MODULE, "HunyuanVideo15TransformerBlock", DOUBLE_STREAM_NORMS,
                       FusedHunyuanVideo15TransformerBlock),),
    fused=("double blocks: AdaLayerNormZero of both streams, attention residual + norm2 + modulation of both "
           "streams (gated-residual kernel); norm_out: AdaLayerNormContinuous"),
    left=("token refiner blocks: affine LayerNorms without modulation (fused_layernorm's kind) and gates only",
          "ByT5 and image projections: LayerNorms without modulation",
          "each block's last residual: the next norm is in the next block"))
