"""Fused AdaLN for blocks written outside the zoo: the ``modulate(LayerNorm(x), shift, scale)``
pattern of Meta's DiT, diffusers and PixArt, and a small protocol for a user's own block.

The protocol (two lines in a block)::

    from opendit_lite.converter import norm_modulate

    class MyBlock(nn.Module):
        adaln_norms = ("norm1", "norm2")   # affine-free nn.LayerNorm children whose output is modulated

        def __init__(self, dim):
            ...
            self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

        def forward(self, x, c):
            shift, scale, gate = self.ada(c).chunk(3, dim=-1)                 # 3 x [B, D]
            h = norm_modulate(self.norm1, x, shift, scale)                    # [B, N, D]
            ...

``norm_modulate(norm, x, shift, scale)`` is ``LayerNorm(x) * (1 + scale) + shift`` (shift/scale per
sample [B, D] / [B, 1, D] or per token [B, N, D]), computed as written until the converter, with
``fused_adaln`` on, replaces each LayerNorm named in ``adaln_norms`` by an ``AdaLNLayerNorm``: an
``nn.LayerNorm`` subclass with the same settings and (empty) state dict whose ``modulate`` runs the
fused kernel (``opendit_lite.kernels.fused_adaln``). Called with ``x`` alone it is still a plain
LayerNorm, so other uses of the norm keep working.

Blocks of other projects cannot declare anything, so each family registers a recogniser and a
converter with ``register_adaln_block`` (``meta_dit.py``, ``diffusers_blocks.py``,
``diffusers_norms.py``, and each diffusers family's ``opendit_lite/families/<family>/fused_norms.py``
through ``diffusers_family_blocks.register_fused_norms``): the converter swaps the named norms as
above and rebinds the block's forward to one that calls ``norm_modulate`` (and
``residual_norm_modulate`` where adaLN-Zero's gated residual feeds the next modulated norm)
(``class_swap.py``). All families run as one
conversion named ``fused_adaln``, switched on by the ``fused_adaln`` key like the zoo's own
``LayerNormModulate`` conversion. A model class may also register what the conversion does and
leaves in it, and why (``register_adaln_model``), which ``parallelize`` prints in its report and
in the warning when nothing matched.
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from opendit_lite.models.layers.modulate import modulate

from .builtin import _fused_adaln_describe, _fused_adaln_enabled
from .registry import CONVERSIONS, register_conversion


class AdaLNLayerNorm(nn.LayerNorm):
    """An ``nn.LayerNorm`` whose ``modulate(x, shift, scale)`` is the fused kernel: affine-free, or
    with the weight and bias of the norm it replaces (the same Parameters), which the kernel folds
    into the modulation.

    x: [B, N, D]; shift, scale: [B, D], [B, 1, D] or [B, N, D]; returns [B, N, D]. Other shapes of
    ``x`` take the unfused formula.
    """

    @classmethod
    def from_layernorm(cls, norm: nn.LayerNorm) -> "AdaLNLayerNorm":
        if len(norm.normalized_shape) != 1:
            raise ValueError(f"fused AdaLN normalises the last dimension only, got {norm}")
        new = cls(norm.normalized_shape, eps=norm.eps, elementwise_affine=False)
        # An affine norm keeps its own Parameters (optimizer state, sharding and keys carry over).
        new.weight, new.bias = norm.weight, norm.bias
        new.elementwise_affine = norm.weight is not None
        new.train(norm.training)
        return new

    def modulate(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            return modulate(self(x), shift, scale)
        from opendit_lite.kernels import fused_adaln  # see builtin.py: kernels load at conversion time

        return fused_adaln(x, shift, scale, self.eps, weight=self.weight, bias=self.bias)   # [B, N, D]

    def residual_modulate(self, x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor,
                          scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``x_new = x + gate * h`` and ``self.modulate(x_new, shift, scale)`` in one pass (3-D x;
        gate, shift, scale of one layout, see ``residual_norm_modulate``)."""
        from opendit_lite.kernels import gated_residual_adaln

        return gated_residual_adaln(x, h, gate, shift, scale, self.eps, weight=self.weight, bias=self.bias)


def norm_modulate(norm: nn.Module, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``norm(x) * (1 + scale) + shift``, fused when ``norm`` is an ``AdaLNLayerNorm``.

    x: [B, N, D]; shift, scale: [B, D] (broadcast over N), [B, 1, D] or [B, N, D]. Returns [B, N, D].
    """
    if isinstance(norm, AdaLNLayerNorm):
        return norm.modulate(x, shift, scale)
    return modulate(norm(x), shift, scale)


def residual_norm_modulate(norm: nn.Module, x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor,
                           shift: torch.Tensor, scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """adaLN-Zero's gated residual and the modulated norm that follows it: ``x_new = x + gate * h``
    and ``norm(x_new) * (1 + scale) + shift``, one pass over the activations when ``norm`` is an
    ``AdaLNLayerNorm`` (``opendit_lite.kernels.gated_residual_adaln``).

    x, h: [B, N, D]; gate, shift, scale: [B, D] (broadcast over N), [B, 1, D] or [B, N, D]. Returns
    (x_new, modulated), both [B, N, D].
    """
    gate, shift, scale = (t.unsqueeze(1) if t.dim() == x.dim() - 1 else t for t in (gate, shift, scale))
    if isinstance(norm, AdaLNLayerNorm) and x.dim() == 3 and gate.shape == shift.shape == scale.shape:
        return norm.residual_modulate(x, h, gate, shift, scale)
    x = x + gate * h                                                           # [B, N, D]
    return x, norm_modulate(norm, x, shift, scale)


def fuse_norms(block: nn.Module, names: Sequence[str]) -> nn.Module:
    """Replace the LayerNorm children ``names`` of ``block`` by ``AdaLNLayerNorm`` (in place); affine
    norms keep their weight and bias."""
    for name in names:
        norm = getattr(block, name, None)
        if isinstance(norm, AdaLNLayerNorm):
            continue
        if not isinstance(norm, nn.LayerNorm):
            raise TypeError(f"{type(block).__qualname__}.{name} must be an nn.LayerNorm for fused AdaLN, "
                            f"found {type(norm).__qualname__}")
        setattr(block, name, AdaLNLayerNorm.from_layernorm(norm))
    return block


def declares_adaln_norms(module: nn.Module) -> bool:
    """True for a block implementing the protocol (a non-empty ``adaln_norms`` class attribute)."""
    return bool(getattr(type(module), "adaln_norms", ()))


def _convert_protocol_block(block: nn.Module) -> nn.Module:
    names = type(block).adaln_norms
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise TypeError(f"{type(block).__qualname__}.adaln_norms must be a tuple of child names, got {names!r}")
    for name in names:
        norm = getattr(block, name, None)
        if not isinstance(norm, nn.LayerNorm) or norm.weight is not None or norm.bias is not None:
            raise TypeError(
                f"{type(block).__qualname__}.adaln_norms names {name!r}, which must be an affine-free "
                f"nn.LayerNorm(dim, elementwise_affine=False) child, found {norm!r}"
            )
    return fuse_norms(block, names)


@dataclasses.dataclass(frozen=True)
class AdaLNBlockFamily:
    """How to recognise and convert one kind of foreign block (see ``register_adaln_block``)."""

    name: str
    matches: Callable[[nn.Module], bool]
    convert: Callable[[nn.Module], nn.Module]


# Families in registration order; the first whose ``matches`` accepts a module converts it.
ADALN_BLOCK_FAMILIES: List[AdaLNBlockFamily] = []


def register_adaln_block(name: str, matches: Callable[[nn.Module], bool],
                         convert: Callable[[nn.Module], nn.Module]) -> AdaLNBlockFamily:
    """Add a family of blocks to the ``fused_adaln`` conversion.

    ``matches(module)`` recognises a block (by its exact class or its declared structure, never by
    a name); ``convert(block)`` makes it use ``norm_modulate`` with ``AdaLNLayerNorm`` norms in place
    (``fuse_norms`` + ``class_swap.swap_class``) and returns it; it must keep parameters and
    state-dict keys. A duplicate name is an error.
    """
    if any(family.name == name for family in ADALN_BLOCK_FAMILIES):
        raise ValueError(f"an AdaLN block family named {name!r} is already registered")
    family = AdaLNBlockFamily(name, matches, convert)
    ADALN_BLOCK_FAMILIES.append(family)
    return family


def adaln_family_of(module: nn.Module) -> Optional[AdaLNBlockFamily]:
    """The first registered family that recognises ``module``, or None."""
    for family in ADALN_BLOCK_FAMILIES:
        if family.matches(module):
            return family
    return None


def _convert_block(module: nn.Module, config, context: dict) -> nn.Module:
    return adaln_family_of(module).convert(module)


@dataclasses.dataclass(frozen=True)
class AdaLNModelNotes:
    """What ``fused_adaln`` fuses in one model class, what it leaves and why (see ``register_adaln_model``)."""

    model: str                 # the model class's name, for messages
    fused: str                 # one line: the modules and patterns it fuses ("" when nothing matches)
    left: Tuple[str, ...] = ()  # each: a module or pattern left unfused, and why


# (module name, class name) -> notes; looked up on the model's exact class.
ADALN_MODEL_NOTES: Dict[Tuple[str, str], AdaLNModelNotes] = {}


def register_adaln_model(module_name: str, class_name: str, fused: str, left: Sequence[str] = ()) -> AdaLNModelNotes:
    """Say what ``fused_adaln`` does in models of class ``module_name.class_name`` (another library's
    class, named so that registering imports nothing): ``fused``, one line of what it fuses ("" when
    the family's modulation matches none of the kernels), and ``left``, what it leaves and why.
    ``parallelize`` prints them and, when nothing was converted, warns with them."""
    key = (module_name, class_name)
    if key in ADALN_MODEL_NOTES:
        raise ValueError(f"fused AdaLN notes for {module_name}.{class_name} are already registered")
    notes = ADALN_MODEL_NOTES[key] = AdaLNModelNotes(class_name, fused, tuple(left))
    return notes


def adaln_model_notes(model: nn.Module) -> Optional[AdaLNModelNotes]:
    """The notes registered for ``model``'s exact class, or None."""
    cls = type(model)
    return ADALN_MODEL_NOTES.get((cls.__module__, cls.__qualname__))


register_adaln_block("adaln_norms protocol", declares_adaln_norms, _convert_protocol_block)
register_conversion(nn.Module, _convert_block, name="fused_adaln", enabled=_fused_adaln_enabled,
                    describe=_fused_adaln_describe, include_subclasses=True,
                    when=lambda module: adaln_family_of(module) is not None, registry=CONVERSIONS)
