"""What the block conversions of the diffusers families share (each family's own swaps are in
``opendit_lite/families/<family>/fused_norms.py``, registered with the family).

* ``FusedBlock`` / ``FusedNorms``: what one family declares to the ``fused_adaln`` conversion: the
  block classes whose forward is rebound, and one line of what is fused and what is left and why;
  ``register_fused_norms`` registers them (``register_family_block`` per block and
  ``register_adaln_model`` for the model class), ``fused_norms_registered`` says whether they are;
* ``register_family_block``: the recogniser and converter of one diffusers block class (its exact
  class, its norms the kernels take; the norms fused by ``diffusers_norms.fuse_child_norms`` and the
  forward rebound to the family's mixin by ``class_swap``);
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

from dataclasses import dataclass
from typing import Callable, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .adaln_protocol import (
    ADALN_BLOCK_FAMILIES,
    ADALN_MODEL_NOTES,
    register_adaln_block,
    register_adaln_model,
    residual_norm_modulate,
)
from .class_swap import swap_class
from .diffusers_norms import fuse_child_norms, is_fusable_norm
from .foreign_classes import is_exactly

NormNames = Union[Sequence[str], Callable[[nn.Module], Sequence[str]]]

# The norms of a double-stream block, and what fused_adaln fuses in a Flux-like model (Flux, HunyuanVideo).
DOUBLE_STREAM_NORMS = ("norm1", "norm1_context", "norm2", "norm2_context")
DOUBLE_AND_SINGLE_STREAM_FUSED = (
    "double blocks: AdaLayerNormZero of both streams, attention residual + norm2 + modulation of both streams "
    "(gated-residual kernel); single blocks: AdaLayerNormZeroSingle; norm_out: AdaLayerNormContinuous")


def _any_block(block: nn.Module) -> bool:
    return True


@dataclass(frozen=True)
class FusedBlock:
    """One diffusers block class (``module_name.class_name``) whose norms ``norms`` (names, or a
    function of the block giving them) are fused and whose forward is rebound to ``mixin``'s, for
    blocks where ``fits`` holds (see ``register_family_block``)."""

    module_name: str
    class_name: str
    norms: NormNames
    mixin: type
    fits: Callable[[nn.Module], bool] = _any_block


@dataclass(frozen=True)
class FusedNorms:
    """What ``fused_adaln`` does in one family's model class: its ``blocks`` (none when its
    modulation matches no kernel), ``fused`` (one line: what is fused, "" for nothing) and ``left``
    (each: what is left unfused, and why), which ``parallelize`` reports."""

    blocks: Tuple[FusedBlock, ...]
    fused: str
    left: Tuple[str, ...] = ()


def register_fused_norms(module_name: str, class_name: str, fused_norms: FusedNorms) -> None:
    """Register a family's ``fused_norms`` for its model class ``module_name.class_name``."""
    for block in fused_norms.blocks:
        register_family_block(block.module_name, block.class_name, block.norms, block.mixin, block.fits)
    register_adaln_model(module_name, class_name, fused=fused_norms.fused, left=fused_norms.left)


def fused_norms_registered(module_name: str, class_name: str, fused_norms: FusedNorms) -> bool:
    """Whether ``register_fused_norms`` has registered ``fused_norms`` for that model class."""
    names = {family.name for family in ADALN_BLOCK_FAMILIES}
    notes = ADALN_MODEL_NOTES.get((module_name, class_name))
    return (notes is not None and notes.fused == fused_norms.fused and notes.left == tuple(fused_norms.left)
            and all(f"diffusers {block.class_name}" in names for block in fused_norms.blocks))


def register_family_block(module_name: str, class_name: str, norms: NormNames, mixin: type,
                          fits: Callable[[nn.Module], bool] = _any_block) -> None:
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
