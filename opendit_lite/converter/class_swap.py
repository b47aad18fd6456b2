"""Give a module of another project a new ``forward`` in place, keeping everything else.

A block written outside the zoo (Meta's ``DiTBlock``, diffusers' ``BasicTransformerBlock``, timm's
``Attention``) calls LayerNorm, modulation and SDPA inline in its ``forward``, so no submodule swap
can reach them. ``swap_class(module, mixin)`` changes the instance's class to a subclass of its own
class with ``mixin`` first in the MRO: the mixin's ``forward`` (which computes the same function
through swappable pieces) takes over, while the parameters, buffers, children, state-dict keys,
hooks and ``isinstance`` checks of the original class stay as they were. The subclass is made once
per (mixin, class) pair and named ``mixin.class_prefix + original name`` so reports and reprs show
the change.

Deep copies (an EMA model) keep the swapped class. Pickling a whole module object with a swapped
class is not supported (state dicts are unaffected): the subclass is not importable by name.
"""

from typing import Dict, Tuple

import torch.nn as nn

_SWAPPED: Dict[Tuple[type, type], type] = {}


def swapped_class(cls: type, mixin: type) -> type:
    """The subclass of ``cls`` with ``mixin`` first in its MRO (made once, then reused)."""
    key = (mixin, cls)
    if key not in _SWAPPED:
        name = f"{getattr(mixin, 'class_prefix', mixin.__name__)}{cls.__name__}"
        _SWAPPED[key] = type(name, (mixin, cls), {"__module__": mixin.__module__, "_original_class": cls})
    return _SWAPPED[key]


def swap_class(module: nn.Module, mixin: type) -> nn.Module:
    """Rebind ``module``'s class to ``swapped_class(type(module), mixin)`` in place; returns it.
    Already swapped with this mixin: unchanged."""
    if not isinstance(module, mixin):
        module.__class__ = swapped_class(type(module), mixin)
    return module

