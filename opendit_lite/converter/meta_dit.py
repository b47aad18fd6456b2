"""Fused AdaLN for Meta's DiT (facebookresearch/DiT ``models.py``): ``DiTBlock`` and ``FinalLayer``.

That file is not a package, so its classes are recognised by the structure the published
architecture declares, exactly and nothing looser:

* ``DiTBlock``: children exactly ``norm1``, ``attn``, ``norm2``, ``mlp``, ``adaLN_modulation``, the
  norms affine-free ``nn.LayerNorm(D)``, ``adaLN_modulation = Sequential(SiLU, Linear(D, 6 D))``;
  forward ``(x [B, N, D], c [B, D])``;
* ``FinalLayer``: children exactly ``norm_final``, ``linear``, ``adaLN_modulation``, with
  ``adaLN_modulation = Sequential(SiLU, Linear(D, 2 D))``; forward ``(x, c)``.

The conversion swaps the norms for ``AdaLNLayerNorm`` and rebinds ``forward`` (``class_swap.py``)
to the same computation with each ``modulate(norm(x), shift, scale)`` through ``norm_modulate``.
Parameters and state-dict keys are unchanged, so Meta's checkpoints load before and after.
A model that changes the block (extra children, another modulation width) is not matched; give it
the ``adaln_norms`` protocol instead (``adaln_protocol.py``).
"""

import torch
import torch.nn as nn

from .adaln_protocol import fuse_norms, norm_modulate, register_adaln_block
from .class_swap import swap_class


def _is_affine_free_layernorm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) and module.weight is None and module.bias is None \
        and len(module.normalized_shape) == 1


def _modulation_width(module: nn.Module, hidden_size: int) -> int:
    """Output width of an ``adaLN_modulation = Sequential(SiLU, Linear(hidden_size, k))``, else 0."""
    if not (isinstance(module, nn.Sequential) and len(module) == 2 and type(module[0]) is nn.SiLU
            and type(module[1]) is nn.Linear and module[1].in_features == hidden_size):
        return 0
    return module[1].out_features


def is_meta_dit_block(module: nn.Module) -> bool:
    """Meta's ``DiTBlock`` (or a module of exactly its structure)."""
    if set(module._modules) != {"norm1", "attn", "norm2", "mlp", "adaLN_modulation"}:
        return False
    norm1, norm2 = module._modules["norm1"], module._modules["norm2"]
    if not (_is_affine_free_layernorm(norm1) and _is_affine_free_layernorm(norm2)):
        return False
    hidden_size = norm1.normalized_shape[0]
    return (norm2.normalized_shape == norm1.normalized_shape
            and _modulation_width(module._modules["adaLN_modulation"], hidden_size) == 6 * hidden_size)


def is_meta_dit_final_layer(module: nn.Module) -> bool:
    """Meta's ``FinalLayer`` (or a module of exactly its structure)."""
    if set(module._modules) != {"norm_final", "linear", "adaLN_modulation"}:
        return False
    norm = module._modules["norm_final"]
    if not _is_affine_free_layernorm(norm):
        return False
    hidden_size = norm.normalized_shape[0]
    return _modulation_width(module._modules["adaLN_modulation"], hidden_size) == 2 * hidden_size


class FusedMetaDiTBlock:
    """Forward of Meta's ``DiTBlock`` with fused norm + modulation (mixed in by ``swap_class``)."""

    class_prefix = "FusedAdaLN"

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        # x: [B, N, D] tokens; c: [B, D] timestep + class embedding.
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = \
            self.adaLN_modulation(c).chunk(6, dim=1)                                       # 6 x [B, D]
        x = x + gate_msa.unsqueeze(1) * self.attn(norm_modulate(self.norm1, x, shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(norm_modulate(self.norm2, x, shift_mlp, scale_mlp))
        return x                                                                           # [B, N, D]


class FusedMetaDiTFinalLayer:
    """Forward of Meta's ``FinalLayer`` with fused norm + modulation."""

    class_prefix = "FusedAdaLN"

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)                            # 2 x [B, D]
        x = norm_modulate(self.norm_final, x, shift, scale)                                # [B, N, D]
        return self.linear(x)                                                              # [B, N, p*p*C]


def _convert_block(block: nn.Module) -> nn.Module:
    return swap_class(fuse_norms(block, ("norm1", "norm2")), FusedMetaDiTBlock)


def _convert_final_layer(layer: nn.Module) -> nn.Module:
    return swap_class(fuse_norms(layer, ("norm_final",)), FusedMetaDiTFinalLayer)


register_adaln_block("Meta DiTBlock", is_meta_dit_block, _convert_block)
register_adaln_block("Meta FinalLayer", is_meta_dit_final_layer, _convert_final_layer)
