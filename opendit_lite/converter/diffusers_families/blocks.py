"""What the block conversions of the diffusers families share.

* ``register_family_block``: the recogniser and converter of one diffusers block class (its exact
  class, its norms the kernels take; the norms fused by ``norms.fuse_child_norms`` and the forward
  rebound to the family's mixin by ``class_swap``);
* ``residual_feed_forward``: the second half of an adaLN-Zero block on one stream, the attention
  output's gated residual fused with the next norm and its modulation (``residual_norm_modulate``),
  the feed-forward, and its gated residual. Unfused, for each stream::

      x = x + gate_msa[:, None] * attn_output
      h = norm2(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
      x = x + gate_mlp[:, None] * ff(h)

  where the first two lines read and write the residual stream five times; fused, once;
* ``double_stream_forward``: the double-stream block of Flux and HunyuanVideo (MMDiT): both
  streams' ``AdaLayerNormZero``, the joint attention, then ``residual_feed_forward`` per stream.
"""

from typing import Callable, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..adaln_protocol import register_adaln_block, residual_norm_modulate
from ..class_swap import swap_class
from ..foreign import is_exactly
from .norms import fuse_child_norms, is_fusable_norm

NormNames = Union[Sequence[str], Callable[[nn.Module], Sequence[str]]]

# The norms of a double-stream block, and what fused_adaln fuses in a Flux-like model (Flux, HunyuanVideo).
DOUBLE_STREAM_NORMS = ("norm1", "norm1_context", "norm2", "norm2_context")
DOUBLE_AND_SINGLE_STREAM_FUSED = (
    "double blocks: AdaLayerNormZero of both streams, attention residual + norm2 + modulation of both streams "
    "(gated-residual kernel); single blocks: AdaLayerNormZeroSingle; norm_out: AdaLayerNormContinuous")


def register_family_block(module_name: str, class_name: str, norms: NormNames, mixin: type,
                          fits: Callable[[nn.Module], bool] = lambda block: True) -> None:
    """Add diffusers' ``module_name.class_name`` blocks to the fused_adaln conversion: a block of
    exactly that class whose children ``norms`` (names, or a function of the block giving them) are
    all norms the kernels take, and for which ``fits`` holds, gets those norms fused and its
    forward rebound to ``mixin``'s."""
    def names(block: nn.Module) -> Sequence[str]:
        return norms(block) if callable(norms) else norms

    def matches(module: nn.Module) -> bool:
        return (is_exactly(module, module_name, class_name) and fits(module)
                and all(is_fusable_norm(getattr(module, name, None)) for name in names(module)))

    def convert(block: nn.Module) -> nn.Module:
        return swap_class(fuse_child_norms(block, names(block)), mixin)

    register_adaln_block(f"diffusers {class_name}", matches, convert)


def residual_feed_forward(norm: nn.Module, feed_forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                          attn_output: torch.Tensor, gate_msa: torch.Tensor, shift_mlp: torch.Tensor,
                          scale_mlp: torch.Tensor, gate_mlp: torch.Tensor) -> torch.Tensor:
    """x, attn_output: [B, N, D]; gate_msa, shift_mlp, scale_mlp, gate_mlp: [B, D]. Returns [B, N, D]."""
    x, h = residual_norm_modulate(norm, x, attn_output, gate_msa, shift_mlp, scale_mlp)   # 2 x [B, N, D]
    return x + gate_mlp.unsqueeze(1) * feed_forward(h)                                    # [B, N, D]


def double_stream_forward(block: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                          temb: torch.Tensor, attend: Callable[[torch.Tensor, torch.Tensor], tuple]
                          ) -> Tuple[torch.Tensor, torch.Tensor, tuple]:
    """hidden_states: [B, N, D] image/video tokens; encoder_hidden_states: [B, M, D] text tokens;
    temb: [B, D]; ``attend(norm_hidden, norm_encoder)`` runs the block's joint attention. Returns
    the two new streams and any further attention outputs (an IP-adapter's)."""
    norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.norm1(hidden_states, emb=temb)
    norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = block.norm1_context(
        encoder_hidden_states, emb=temb)
    attention_outputs = attend(norm_hidden_states, norm_encoder_hidden_states)
    attn_output, context_attn_output = attention_outputs[:2]                          # [B, N, D], [B, M, D]
    hidden_states = residual_feed_forward(block.norm2, block.ff, hidden_states, attn_output,
                                          gate_msa, shift_mlp, scale_mlp, gate_mlp)           # [B, N, D]
    encoder_hidden_states = residual_feed_forward(block.norm2_context, block.ff_context, encoder_hidden_states,
                                                  context_attn_output, c_gate_msa, c_shift_mlp, c_scale_mlp,
                                                  c_gate_mlp)                                 # [B, M, D]
    return hidden_states, encoder_hidden_states, tuple(attention_outputs[2:])
