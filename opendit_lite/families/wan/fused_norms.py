"""Fused AdaLN in diffusers' ``WanTransformer3DModel`` (Wan 2.1 / 2.2).

``WanTransformerBlock`` modulates inline in its forward: six chunks of ``scale_shift_table + temb``
([B, 6, D]; Wan 2.2's per-token timesteps give [B, N, 6, D]) modulate ``norm1`` (before
self-attention) and ``norm3`` (before the feed-forward), both affine-free LayerNorms computed in
fp32. The conversion makes both norms ``AdaLNLayerNorm`` and rebinds the forward (``class_swap``)
to diffusers' computation with each norm + modulation as one fused kernel, per sample or per
token; the kernel computes in fp32 and the result is cast back as diffusers does. Parameters
(``scale_shift_table`` included) and state-dict keys are unchanged.

Left: ``norm2`` (the cross-attention's input, an affine LayerNorm with no modulation); the gated
residuals, each followed by the cross-attention or the next block rather than a modulated norm;
the final ``norm_out`` modulation, in the model's own forward once per step.
"""

from ...converter.adaln_protocol import norm_modulate
from ...converter.diffusers_family_blocks import FusedBlock, FusedNorms

MODULE = "diffusers.models.transformers.transformer_wan"


class FusedWanTransformerBlock:
    """``WanTransformerBlock.forward`` with norm1 and norm3 + their modulation fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
        # hidden_states: [B, N, D]; encoder_hidden_states: [B, M, D]; temb: [B, 6, D] or per token [B, N, 6, D].
        if temb.ndim == 4:  # Wan 2.2: per-token modulation, 6 x [B, N, D]
            chunks = (self.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
            chunks = [c.squeeze(2) for c in chunks]
        else:               # 6 x [B, 1, D]
            chunks = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = chunks

        # 1. Self-attention. The kernel normalises in fp32 as FP32LayerNorm does (no fp32 copy of x).
        norm_hidden_states = norm_modulate(self.norm1, hidden_states, shift_msa, scale_msa).type_as(hidden_states)
        attn_output = self.attn1(norm_hidden_states, None, None, rotary_emb)
        hidden_states = (hidden_states.float() + attn_output * gate_msa).type_as(hidden_states)   # [B, N, D]

        # 2. Cross-attention (unmodulated norm).
        norm_hidden_states = self.norm2(hidden_states.float()).type_as(hidden_states)
        hidden_states = hidden_states + self.attn2(norm_hidden_states, encoder_hidden_states, None, None)

        # 3. Feed-forward.
        norm_hidden_states = norm_modulate(self.norm3, hidden_states, c_shift_msa, c_scale_msa).type_as(hidden_states)
        ff_output = self.ffn(norm_hidden_states)
        return (hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)  # [B, N, D]


FUSED_NORMS = FusedNorms(
    blocks=(FusedBlock(MODULE, "WanTransformerBlock", ("norm1", "norm3"), FusedWanTransformerBlock),),
    fused="blocks: norm1 and norm3 with their scale_shift_table modulation (per sample, or per token with "
          "Wan 2.2's per-token timesteps)",
    left=("norm2 (cross-attention input): an affine LayerNorm without modulation",
          "gated residuals: each is followed by the cross-attention or the next block, not by a modulated norm",
          "norm_out: modulated in the model's own forward, once per step"))
