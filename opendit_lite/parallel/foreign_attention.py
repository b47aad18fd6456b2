"""Sequence parallelism for attention modules of other projects and of users: the role an
attention module declares (the attention protocol, documented in
``opendit_lite/converter/attention_adapters.py``), and the adapters of timm's and diffusers'
attention applied before ``apply_sequence_parallel`` plans its swaps.
"""

from typing import Optional

import torch.nn as nn

from opendit_lite.converter.attention_adapters import PROTOCOL, attention_adapter
from opendit_lite.models.layers.attention import AttentionOp

SEQUENCE_PARALLEL_ROLES = ("self", "joint", "cross", "serial")


def declared_role(module: nn.Module) -> Optional[str]:
    """The ``sequence_parallel_attention`` a module's class declares, checked; None if it declares none."""
    role = getattr(type(module), "sequence_parallel_attention", None)
    if role is None:
        return None
    if role not in SEQUENCE_PARALLEL_ROLES:
        raise ValueError(f"{type(module).__qualname__}.sequence_parallel_attention = {role!r}; it must be one "
                         f"of {', '.join(map(repr, SEQUENCE_PARALLEL_ROLES))}")
    if not isinstance(getattr(module, "attn_op", None), AttentionOp):
        raise TypeError(f"{type(module).__qualname__} declares sequence_parallel_attention but has no AttentionOp "
                        f"child named attn_op: {PROTOCOL}")
    return role


def adapt_foreign_attention(model: nn.Module) -> None:
    """Give timm's and diffusers' attention modules an ``attn_op``, or raise naming those that
    cannot take one, before anything is changed."""
    found, refused = [], []
    for name, module in model.named_modules():
        adapter = attention_adapter(module)
        if adapter is None:
            continue
        reason = adapter.unsupported(module)
        if reason is None:
            found.append((adapter, module))
        else:
            refused.append(f"{name} ({adapter.name}): {reason}")
    if refused:
        raise TypeError(f"sequence parallelism cannot run these attention modules: {'; '.join(refused)}. "
                        f"To run one anyway, {PROTOCOL}")
    for adapter, module in found:
        adapter.adapt(module)
