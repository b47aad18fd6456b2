"""Fused AdaLN for diffusers' ``BasicTransformerBlock`` with ``norm_type`` ``"ada_norm_zero"`` (what
``DiTTransformer2DModel`` builds) and ``"ada_norm_single"`` (``PixArtTransformer2DModel``).

Both compute ``LayerNorm(x) * (1 + scale) + shift`` twice per block with affine-free LayerNorms:

* ada_norm_zero: ``norm1`` is an ``AdaLayerNormZero`` (timestep+class embedding -> SiLU -> Linear
  -> 6 chunks of [B, D]) whose ``norm`` feeds the attention; ``norm3`` feeds the MLP;
* ada_norm_single: the six [B, 1, D] chunks are ``scale_shift_table + timestep`` (the model's
  ``AdaLayerNormSingle`` output); ``norm1`` feeds the self-attention and ``norm2`` the MLP
  (cross-attention takes the raw hidden states, as in PixArt).

The block is recognised by its exact class (``diffusers.models.attention.BasicTransformerBlock``,
already imported) and those settings with affine-free norms and no block-level positional
embedding; its forward is rebound (``class_swap.py``) to the same computation for these two norm
types with the modulated norms through ``norm_modulate``. Parameters, state-dict keys, the
attention modules (and their processors) and the feed-forward are untouched. The final layer's
modulation of both models runs in the model's own forward, once per step, and stays unfused.
"""

import torch.nn as nn

from .adaln_protocol import fuse_norms, norm_modulate, register_adaln_block
from .class_swap import swap_class
from .foreign_classes import is_exactly

_NORM_TYPES = ("ada_norm_zero", "ada_norm_single")


def _affine_free(norm) -> bool:
    return isinstance(norm, nn.LayerNorm) and norm.weight is None and norm.bias is None


def _modulated_norms(block: nn.Module):
    """(the module holding the attention norm, its name, the MLP norm's name) by norm type."""
    if block.norm_type == "ada_norm_zero":
        return block.norm1, "norm", "norm3"
    return block, "norm1", "norm2"


def is_diffusers_adaln_block(module: nn.Module) -> bool:
    """A diffusers ``BasicTransformerBlock`` this conversion handles."""
    if not is_exactly(module, "diffusers.models.attention", "BasicTransformerBlock"):
        return False
    if module.norm_type not in _NORM_TYPES or module.pos_embed is not None:
        return False
    if module.norm_type == "ada_norm_zero" and not (
            is_exactly(module.norm1, "diffusers.models.normalization", "AdaLayerNormZero")
            and module.norm1.emb is not None):
        return False
    holder, attention_norm, mlp_norm = _modulated_norms(module)
    return _affine_free(getattr(holder, attention_norm)) and _affine_free(getattr(module, mlp_norm))


class FusedBasicTransformerBlock:
    """``BasicTransformerBlock.forward`` for ada_norm_zero / ada_norm_single with fused AdaLN."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                encoder_attention_mask=None, timestep=None, cross_attention_kwargs=None,
                class_labels=None, added_cond_kwargs=None):
        # hidden_states: [B, N, D]; encoder_hidden_states: [B, M, Dc] or None.
        batch_size = hidden_states.shape[0]
        holder, attention_norm, mlp_norm = _modulated_norms(self)
        if self.norm_type == "ada_norm_zero":
            ada = self.norm1
            emb = ada.linear(ada.silu(ada.emb(timestep, class_labels, hidden_dtype=hidden_states.dtype)))
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)  # 6 x [B, D]
            gate_msa, gate_mlp = gate_msa.unsqueeze(1), gate_mlp.unsqueeze(1)                  # [B, 1, D]
        else:  # ada_norm_single: timestep is the model's [B, 6 D] AdaLayerNormSingle output
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
                self.scale_shift_table[None] + timestep.reshape(batch_size, 6, -1)
            ).chunk(6, dim=1)                                                                  # 6 x [B, 1, D]

        norm_hidden_states = norm_modulate(getattr(holder, attention_norm), hidden_states,
                                           shift_msa, scale_msa)                               # [B, N, D]
        cross_attention_kwargs = dict(cross_attention_kwargs) if cross_attention_kwargs is not None else {}
        gligen_kwargs = cross_attention_kwargs.pop("gligen", None)
        attn_output = self.attn1(
            norm_hidden_states,
            encoder_hidden_states=encoder_hidden_states if self.only_cross_attention else None,
            attention_mask=attention_mask,
            **cross_attention_kwargs,
        )
        hidden_states = gate_msa * attn_output + hidden_states                                 # [B, N, D]
        if hidden_states.ndim == 4:
            hidden_states = hidden_states.squeeze(1)
        if gligen_kwargs is not None:
            hidden_states = self.fuser(hidden_states, gligen_kwargs["objs"])

        if self.attn2 is not None:
            # ada_norm_zero normalises (affine-free, unmodulated) before cross-attention; PixArt does not.
            norm_hidden_states = self.norm2(hidden_states) if self.norm_type == "ada_norm_zero" else hidden_states
            attn_output = self.attn2(
                norm_hidden_states,
                encoder_hidden_states=encoder_hidden_states,
                attention_mask=encoder_attention_mask,
                **cross_attention_kwargs,
            )
            hidden_states = attn_output + hidden_states

        norm_hidden_states = norm_modulate(getattr(self, mlp_norm), hidden_states, shift_mlp, scale_mlp)
        if self._chunk_size is not None:
            from diffusers.models.attention import _chunked_feed_forward

            ff_output = _chunked_feed_forward(self.ff, norm_hidden_states, self._chunk_dim, self._chunk_size)
        else:
            ff_output = self.ff(norm_hidden_states)
        hidden_states = gate_mlp * ff_output + hidden_states                                   # [B, N, D]
        if hidden_states.ndim == 4:
            hidden_states = hidden_states.squeeze(1)
        return hidden_states


def _convert(block: nn.Module) -> nn.Module:
    holder, attention_norm, mlp_norm = _modulated_norms(block)
    fuse_norms(holder, (attention_norm,))
    fuse_norms(block, (mlp_norm,))
    return swap_class(block, FusedBasicTransformerBlock)


register_adaln_block("diffusers BasicTransformerBlock", is_diffusers_adaln_block, _convert)
