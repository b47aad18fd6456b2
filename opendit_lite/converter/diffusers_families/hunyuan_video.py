"""Fused AdaLN in diffusers' ``HunyuanVideoTransformer3DModel``.

* ``HunyuanVideoTransformerBlock`` (double stream): ``norm1`` / ``norm1_context`` are
  ``AdaLayerNormZero`` (``norms.py``); each stream's attention residual and ``norm2`` /
  ``norm2_context`` with the feed-forward's modulation run as one gated-residual kernel
  (``residual.residual_feed_forward``). The forward is diffusers' computation with those calls; like
  diffusers', it ignores the extra positional arguments the model passes (token-replace inputs).
* ``HunyuanVideoSingleTransformerBlock``: ``AdaLayerNormZeroSingle`` (``norms.py``).
* ``norm_out``: ``AdaLayerNormContinuous`` (``norms.py``).

Left: the token refiner's blocks (affine LayerNorms, no modulation: ``fused_layernorm``'s kind),
and the blocks built for ``image_condition_type="token_replace"``, whose first-frame tokens take a
modulation of their own (``HunyuanVideoTokenReplace*`` norms).
"""

import torch.nn as nn

from ..adaln_protocol import register_adaln_block, register_adaln_model
from ..class_swap import swap_class
from ..foreign import is_exactly
from .norms import fuse_child_norms, is_fusable_norm
from .residual import residual_feed_forward

MODULE = "diffusers.models.transformers.transformer_hunyuan_video"
NORMS = ("norm1", "norm1_context", "norm2", "norm2_context")


def is_hunyuan_video_block(module: nn.Module) -> bool:
    return is_exactly(module, MODULE, "HunyuanVideoTransformerBlock") and all(
        is_fusable_norm(getattr(module, name, None)) for name in NORMS)


class FusedHunyuanVideoTransformerBlock:
    """``HunyuanVideoTransformerBlock.forward`` with the gated residual + norm2 of each stream fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb, attention_mask=None, freqs_cis=None,
                *args, **kwargs):
        # hidden_states: [B, N, D] video tokens; encoder_hidden_states: [B, M, D] text tokens; temb: [B, D].
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
            encoder_hidden_states, emb=temb)
        attn_output, context_attn_output = self.attn(hidden_states=norm_hidden_states,
                                                     encoder_hidden_states=norm_encoder_hidden_states,
                                                     attention_mask=attention_mask, image_rotary_emb=freqs_cis)
        hidden_states = residual_feed_forward(self.norm2, self.ff, hidden_states, attn_output,
                                              gate_msa, shift_mlp, scale_mlp, gate_mlp)           # [B, N, D]
        encoder_hidden_states = residual_feed_forward(self.norm2_context, self.ff_context, encoder_hidden_states,
                                                      context_attn_output, c_gate_msa, c_shift_mlp, c_scale_mlp,
                                                      c_gate_mlp)                                 # [B, M, D]
        return hidden_states, encoder_hidden_states


def _convert(block: nn.Module) -> nn.Module:
    return swap_class(fuse_child_norms(block, NORMS), FusedHunyuanVideoTransformerBlock)


register_adaln_block("diffusers HunyuanVideoTransformerBlock", is_hunyuan_video_block, _convert)
register_adaln_model(
    MODULE, "HunyuanVideoTransformer3DModel",
    fused="double blocks: AdaLayerNormZero of both streams, attention residual + norm2 + modulation of both "
          "streams (gated-residual kernel); single blocks: AdaLayerNormZeroSingle; norm_out: AdaLayerNormContinuous",
    left=("token refiner blocks: affine LayerNorms without modulation (fused_layernorm's kind) and gates only",
          "image_condition_type='token_replace' blocks: their first-frame tokens take a modulation of their own",
          "each block's last residual: the next norm is in the next block"))
