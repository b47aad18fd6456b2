"""Fused AdaLN in diffusers' ``HunyuanVideoTransformer3DModel``.

* ``HunyuanVideoTransformerBlock`` (double stream): ``norm1`` / ``norm1_context`` are
  ``AdaLayerNormZero`` (``diffusers_norms``); each stream's attention residual and ``norm2`` /
  ``norm2_context`` with the feed-forward's modulation run as one gated-residual kernel
  (``diffusers_family_blocks.double_stream_forward``). Like diffusers' forward, it ignores the extra positional
  arguments the model passes (token-replace inputs).
* ``HunyuanVideoSingleTransformerBlock``: ``AdaLayerNormZeroSingle`` (``diffusers_norms``).
* ``norm_out``: ``AdaLayerNormContinuous`` (``diffusers_norms``).

Left: the token refiner's blocks (affine LayerNorms, no modulation: ``fused_layernorm``'s kind),
and the blocks built for ``image_condition_type="token_replace"``, whose first-frame tokens take a
modulation of their own (``HunyuanVideoTokenReplace*`` norms).
"""

from ...converter.diffusers_family_blocks import (
    DOUBLE_AND_SINGLE_STREAM_FUSED,
    DOUBLE_STREAM_NORMS,
    FusedBlock,
    FusedNorms,
    double_stream_forward,
)

MODULE = "diffusers.models.transformers.transformer_hunyuan_video"


class FusedHunyuanVideoTransformerBlock:
    """``HunyuanVideoTransformerBlock.forward`` with the gated residual + norm2 of each stream fused."""

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
    blocks=(FusedBlock(MODULE, "HunyuanVideoTransformerBlock", DOUBLE_STREAM_NORMS,
                       FusedHunyuanVideoTransformerBlock),),
    fused=DOUBLE_AND_SINGLE_STREAM_FUSED,
    left=("token refiner blocks: affine LayerNorms without modulation (fused_layernorm's kind) and gates only",
          "image_condition_type='token_replace' blocks: their first-frame tokens take a modulation of their own",
          "each block's last residual: the next norm is in the next block"))
