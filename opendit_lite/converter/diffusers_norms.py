"""Fused AdaLN for diffusers' adaptive norm modules (``diffusers.models.normalization``), the norms
the transformers of Flux, SD3, HunyuanVideo and CogVideoX call from their blocks and final layers:

=========================  ==========================================  ==============================
module                     computes                                    fused as
=========================  ==========================================  ==============================
AdaLayerNormZero           6 chunks of Linear(SiLU(emb)); norm(x) *    ``norm_modulate`` on the first
                           (1 + scale_msa) + shift_msa                 (shift, scale)
AdaLayerNormZeroSingle     3 chunks; the same with (shift, scale)      ``norm_modulate``
SD35AdaLayerNormZeroX      9 chunks; two modulations of one norm       two ``norm_modulate`` (x read
                           (SD3.5's dual-attention layers)             twice, nothing in between)
AdaLayerNormContinuous     (scale, shift) from the conditioning;       ``norm_modulate``
                           layer_norm type only
AdaLayerNorm               chunk_dim=1 (CogVideoX's final layer):      ``norm_modulate``
                           (shift, scale) per sample
CogVideoXLayerNormZero     one norm, two streams (video and text),     ``norm_modulate`` per stream,
                           each with its own (shift, scale)            the norm's affine folded in
=========================  ==========================================  ==============================

Each is recognised by its exact class, already imported (``foreign.is_exactly``), with a
``LayerNorm`` over the last axis (affine or not: the kernels fold the norm's own weight and bias
into the modulation); its norm becomes an ``AdaLNLayerNorm`` with the same Parameters and its
``forward`` is rebound (``class_swap``) to the same computation through ``norm_modulate``. The
signatures, return values and state-dict keys stay diffusers' own, so every block that calls these
modules, in these families or another, runs them fused. Other norm types (RMSNorm in
``AdaLayerNormContinuous``, chunk_dim 0 in ``AdaLayerNorm``) are not matched.
"""

import torch
import torch.nn as nn

from .adaln_protocol import fuse_norms, norm_modulate, register_adaln_block
from .class_swap import swap_class
from .foreign_classes import is_exactly

NORMALIZATION = "diffusers.models.normalization"


def is_last_axis_layernorm(norm) -> bool:
    """An ``nn.LayerNorm`` (diffusers' FP32LayerNorm included) over the last axis: what the kernels take."""
    return isinstance(norm, nn.LayerNorm) and len(norm.normalized_shape) == 1


def _norm_module(class_name: str):
    """Recogniser of ``NORMALIZATION.class_name`` modules whose ``norm`` child the kernels take."""
    def matches(module: nn.Module) -> bool:
        return is_exactly(module, NORMALIZATION, class_name) and is_last_axis_layernorm(getattr(module, "norm", None))

    return matches


class FusedAdaLayerNormZero:
    """``AdaLayerNormZero.forward`` with the norm and the attention's modulation fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
        # x: [B, N, D]; emb: [B, D] conditioning (or made from timestep and labels by self.emb).
        if self.emb is not None:
            emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)  # 6 x [B, D]
        x = norm_modulate(self.norm, x, shift_msa, scale_msa)                                  # [B, N, D]
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


class FusedAdaLayerNormZeroSingle:
    """``AdaLayerNormZeroSingle.forward`` (Flux and HunyuanVideo single-stream blocks), fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, x, emb=None):
        shift_msa, scale_msa, gate_msa = self.linear(self.silu(emb)).chunk(3, dim=1)          # 3 x [B, D]
        return norm_modulate(self.norm, x, shift_msa, scale_msa), gate_msa                     # [B, N, D], [B, D]


class FusedSD35AdaLayerNormZeroX:
    """``SD35AdaLayerNormZeroX.forward`` (SD3.5 dual-attention layers): two modulations of one norm."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, emb=None):
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_msa2, scale_msa2,
         gate_msa2) = self.linear(self.silu(emb)).chunk(9, dim=1)                              # 9 x [B, D]
        first = norm_modulate(self.norm, hidden_states, shift_msa, scale_msa)                  # [B, N, D]
        second = norm_modulate(self.norm, hidden_states, shift_msa2, scale_msa2)               # [B, N, D]
        return first, gate_msa, shift_mlp, scale_mlp, gate_mlp, second, gate_msa2


class FusedAdaLayerNormContinuous:
    """``AdaLayerNormContinuous.forward`` (the final layers of Flux, SD3, HunyuanVideo), fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, x: torch.Tensor, conditioning_embedding: torch.Tensor) -> torch.Tensor:
        emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))                      # [B, 2 D]
        scale, shift = torch.chunk(emb, 2, dim=1)                                              # 2 x [B, D]
        return norm_modulate(self.norm, x, shift, scale)                                       # [B, N, D]


class FusedAdaLayerNorm:
    """``AdaLayerNorm.forward`` with ``chunk_dim=1`` (CogVideoX's final layer), fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, x, timestep=None, temb=None):
        if self.emb is not None:
            temb = self.emb(timestep)
        shift, scale = self.linear(self.silu(temb)).chunk(2, dim=1)                           # 2 x [B, D]
        return norm_modulate(self.norm, x, shift, scale)                                       # [B, N, D]


class FusedCogVideoXLayerNormZero:
    """``CogVideoXLayerNormZero.forward``: one norm (with its affine) modulated per stream, fused."""

    class_prefix = "FusedAdaLN"

    def forward(self, hidden_states, encoder_hidden_states, temb):
        # hidden_states: [B, N, D] video tokens; encoder_hidden_states: [B, M, D] text tokens; temb: [B, C].
        shift, scale, gate, enc_shift, enc_scale, enc_gate = self.linear(self.silu(temb)).chunk(6, dim=1)
        hidden_states = norm_modulate(self.norm, hidden_states, shift, scale)                  # [B, N, D]
        encoder_hidden_states = norm_modulate(self.norm, encoder_hidden_states, enc_shift, enc_scale)  # [B, M, D]
        return hidden_states, encoder_hidden_states, gate[:, None, :], enc_gate[:, None, :]


def fuse_norm_module(module: nn.Module) -> nn.Module:
    """Convert one of the norm modules above in place (its norm and its forward); returns it."""
    mixin = _MIXINS[type(module).__name__]
    return swap_class(fuse_norms(module, ("norm",)), mixin)


def fuse_child_norms(block: nn.Module, names) -> nn.Module:
    """For a block converter: each child ``names`` of ``block`` that is one of the adaptive norm
    modules above is converted (``fuse_norm_module``); a plain LayerNorm becomes an
    ``AdaLNLayerNorm`` (for ``norm_modulate`` / ``residual_norm_modulate`` in the block's forward)."""
    for name in names:
        child = getattr(block, name)
        family = next((f for f in _FAMILIES if f.matches(child)), None)
        if family is not None:
            family.convert(child)
        elif is_last_axis_layernorm(child):
            fuse_norms(block, (name,))
        else:
            raise TypeError(f"{type(block).__qualname__}.{name} is {type(child).__qualname__}, which fused AdaLN "
                            f"cannot take; the block's recogniser should not have matched it")
    return block


def _is_adaptive_layer_norm(module: nn.Module) -> bool:
    return _norm_module("AdaLayerNorm")(module) and module.chunk_dim == 1


_MIXINS = {
    "AdaLayerNormZero": FusedAdaLayerNormZero,
    "AdaLayerNormZeroSingle": FusedAdaLayerNormZeroSingle,
    "SD35AdaLayerNormZeroX": FusedSD35AdaLayerNormZeroX,
    "AdaLayerNormContinuous": FusedAdaLayerNormContinuous,
    "AdaLayerNorm": FusedAdaLayerNorm,
    "CogVideoXLayerNormZero": FusedCogVideoXLayerNormZero,
}

_FAMILIES = [register_adaln_block(f"diffusers {name}",
                                  _is_adaptive_layer_norm if name == "AdaLayerNorm" else _norm_module(name),
                                  fuse_norm_module)
             for name in _MIXINS]


def is_fusable_norm(module: nn.Module) -> bool:
    """One of the adaptive norm modules above in a form they convert, or a last-axis LayerNorm."""
    return any(f.matches(module) for f in _FAMILIES) or is_last_axis_layernorm(module)
