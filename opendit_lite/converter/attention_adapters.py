"""Attention modules of other projects, and of users, made to run through a swappable ``attn_op``.

The attention protocol
----------------------
Any attention module opts in to attention backends (flash-attn / SDPA) and sequence parallelism
with two things:

* a child ``attn_op``, an ``opendit_lite.models.layers.attention.AttentionOp`` (``SDPAAttentionOp()``
  to start with), through which it computes its core: ``out = self.attn_op(q, k, v, attn_mask=None)``
  with q ``[B, Nq, H, Dh]``, k, v ``[B, Nk, H, Dh]`` and out ``[B, Nq, H, Dh]`` (projections, norms
  and the output projection stay in the module, applied per token);
* a class attribute ``sequence_parallel_attention`` saying what it attends over:
  ``"self"`` (its own token sequence: Ulysses, ring or USP by ``sp_mode``), ``"joint"`` (``[text; tokens]``
  with the text replicated on every rank, as MMDiT concatenates them), ``"cross"`` (queries from the
  tokens, keys/values from a context every rank holds whole, e.g. text: no communication) or
  ``"serial"`` (an axis that is not sharded; the op stays as it is).

The backend conversion then swaps ``SDPAAttentionOp`` for ``FlashAttentionOp`` and
``apply_sequence_parallel`` wraps the op in the sequence-parallel op of its role and mode
(``opendit_lite.parallel.sp_ops``: ``UlyssesAttentionOp``, ``RingAttentionOp``, ``USPAttentionOp``, their joint
variants, ``SequenceParallelCrossAttentionOp``).

Adapters for modules that cannot declare anything
-------------------------------------------------
* timm's ``Attention`` (Meta's DiT uses it): the instance's forward is rebound (``class_swap``) to the
  same computation with its SDPA call through an ``attn_op`` child: ``"self"``. Not adapted: attention
  dropout > 0 (the ops have none) or ``is_causal``.
* diffusers' ``Attention`` with its default ``AttnProcessor2_0``: ``set_processor`` installs an
  ``OpAttnProcessor`` (an ``nn.Module`` processor holding ``attn_op``), ``"self"`` for an ``Attention``
  built without ``cross_attention_dim`` and ``OpCrossAttnProcessor`` (``"cross"``, keys/values whole)
  for one built with it. Other processors (IP-adapter, added KV, custom) are not adapted.

Both keep parameters and state-dict keys. One conversion, ``attention_backend`` at
``PRIORITY_ADAPTER``, adapts them when the attention backend resolves to flash-attn (the same switch
as the op swap that follows and reaches their ops; with SDPA there is nothing to swap);
``opendit_lite.parallel.apply_sequence_parallel`` adapts them itself. This module does not import
``opendit_lite.parallel``.
"""

import dataclasses
import sys
from typing import Callable, List, Optional

import torch
import torch.nn as nn

from opendit_lite.models.layers.attention import AttentionOp, SDPAAttentionOp

from .builtin import _attention_describe, _attention_enabled
from .class_swap import swap_class
from .foreign_classes import is_exactly, loaded_class
from .registry import CONVERSIONS, PRIORITY_ADAPTER, ConversionRegistry, ConverterOptions

PROTOCOL = (
    "give the module an `attn_op = SDPAAttentionOp()` child that computes its core as "
    "`self.attn_op(q, k, v, attn_mask=None)` with q, k, v and the output in [B, N, H, Dh], and a class "
    "attribute `sequence_parallel_attention = \"self\"` (or \"joint\" for [text; tokens] with the text replicated, "
    "\"cross\" for keys/values from a replicated context, \"serial\" for an axis that is not sharded); see "
    "opendit_lite/converter/attention_adapters.py"
)


# ----------------------------------------------------------------------------------------------
# timm Attention
# ----------------------------------------------------------------------------------------------

class OpTimmAttention:
    """timm ``Attention.forward`` with the SDPA call through ``self.attn_op`` (mixed in by swap_class)."""

    class_prefix = "Op"
    sequence_parallel_attention = "self"

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        if is_causal:
            raise ValueError("the attn_op version of timm Attention does not take is_causal; pass a mask")
        B, N, C = x.shape
        gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)          # [B, N, 3, H, Dh]
        q, k, v = qkv.unbind(2)                                                     # 3 x [B, N, H, Dh]
        q, k = self.q_norm(q), self.k_norm(k)                                       # per head, over Dh
        x = self.attn_op(q, k, v, attn_mask=attn_mask)                              # [B, N, H, Dh]
        x = x.reshape(B, N, self.num_heads * self.head_dim)                         # [B, N, H*Dh]
        x = self.norm(x) if hasattr(self, "norm") else x
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))                                         # [B, N, C]


def _is_timm_attention(module: nn.Module) -> bool:
    return is_exactly(module, "timm.layers.attention", "Attention")


def _timm_unsupported(module: nn.Module) -> Optional[str]:
    if module.attn_drop.p > 0:
        return f"attention dropout p={module.attn_drop.p} (the attention ops have none)"
    return None


def _adapt_timm(module: nn.Module) -> nn.Module:
    module.attn_op = SDPAAttentionOp()
    return swap_class(module, OpTimmAttention)


# ----------------------------------------------------------------------------------------------
# diffusers Attention
# ----------------------------------------------------------------------------------------------

class OpAttnProcessor(nn.Module):
    """A diffusers attention processor computing what ``AttnProcessor2_0`` computes, with the core
    through ``self.attn_op``; for self-attention (Ulysses under sequence parallelism)."""

    sequence_parallel_attention = "self"

    def __init__(self):
        super().__init__()
        self.attn_op: AttentionOp = SDPAAttentionOp()

    def forward(self, attn: nn.Module, hidden_states: torch.Tensor,
                encoder_hidden_states: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None, temb: Optional[torch.Tensor] = None) -> torch.Tensor:
        # Sequence-parallel ops exist only once opendit_lite.parallel is imported (this module does not).
        sequence_parallel_op = loaded_class("opendit_lite.parallel.ulysses", "SequenceParallelOp")
        sharded = sequence_parallel_op is not None and isinstance(self.attn_op, sequence_parallel_op)
        if sharded and self.sequence_parallel_attention == "self":
            if encoder_hidden_states is not None:
                raise ValueError("a diffusers Attention built without cross_attention_dim was called with "
                                 "encoder_hidden_states under sequence parallelism; build it with "
                                 "cross_attention_dim so that it gets the cross-attention processor")
            if attention_mask is not None:
                raise ValueError("self-attention masks are not supported under sequence parallelism "
                                 "(the processor sees a shard of the queries and keys)")
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:  # [B, C, H, W] feature maps -> [B, H*W, C] tokens
            batch_size, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        batch_size, key_length = (hidden_states if encoder_hidden_states is None else encoder_hidden_states).shape[:2]
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, key_length, batch_size)  # [B*H, 1|Nq, Nk]
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        if encoder_hidden_states is None:
            context = hidden_states
        elif attn.norm_cross:
            context = attn.norm_encoder_hidden_states(encoder_hidden_states)
        else:
            context = encoder_hidden_states
        query = attn.to_q(hidden_states)                                            # [B, Nq, H*Dh]
        key, value = attn.to_k(context), attn.to_v(context)                         # [B, Nk, H*Dh]
        head_dim = key.shape[-1] // attn.heads
        query = query.view(batch_size, -1, attn.heads, head_dim)                    # [B, Nq, H, Dh]
        key = key.view(batch_size, -1, attn.heads, head_dim)                        # [B, Nk, H, Dh]
        value = value.view(batch_size, -1, attn.heads, head_dim)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        out = self.attn_op(query, key, value, attn_mask=attention_mask)             # [B, Nq, H, Dh]
        out = out.reshape(batch_size, -1, attn.heads * head_dim).to(query.dtype)    # [B, Nq, H*Dh]
        out = attn.to_out[1](attn.to_out[0](out))                                   # projection, dropout
        if input_ndim == 4:
            out = out.transpose(-1, -2).reshape(batch_size, channel, height, width)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor


class OpCrossAttnProcessor(OpAttnProcessor):
    """``OpAttnProcessor`` for an ``Attention`` built with ``cross_attention_dim``: under sequence
    parallelism the queries stay sharded and the keys/values (the context) whole."""

    sequence_parallel_attention = "cross"


def _is_diffusers_attention(module: nn.Module) -> bool:
    return is_exactly(module, "diffusers.models.attention_processor", "Attention")


def _diffusers_unsupported(module: nn.Module) -> Optional[str]:
    if isinstance(module.processor, OpAttnProcessor):
        return None
    if not is_exactly(module.processor, "diffusers.models.attention_processor", "AttnProcessor2_0"):
        return (f"its processor is {type(module.processor).__qualname__}; only the default AttnProcessor2_0 is "
                f"replaced (set a processor that follows the attention protocol yourself)")
    return None


def _adapt_diffusers(module: nn.Module) -> nn.Module:
    if not isinstance(module.processor, OpAttnProcessor):
        module.set_processor(OpCrossAttnProcessor() if module.is_cross_attention else OpAttnProcessor())
    return module


# ----------------------------------------------------------------------------------------------
# the adapter list and its conversion
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AttentionAdapter:
    """One family of foreign attention modules: ``recognises`` a module of it, says why an instance
    cannot be adapted (``unsupported`` -> reason or None), and ``adapt``s it in place."""

    name: str
    recognises: Callable[[nn.Module], bool]
    unsupported: Callable[[nn.Module], Optional[str]]
    adapt: Callable[[nn.Module], nn.Module]


ATTENTION_ADAPTERS: List[AttentionAdapter] = [
    AttentionAdapter("timm Attention", _is_timm_attention, _timm_unsupported, _adapt_timm),
    AttentionAdapter("diffusers Attention", _is_diffusers_attention, _diffusers_unsupported, _adapt_diffusers),
]


def attention_adapter(module: nn.Module) -> Optional[AttentionAdapter]:
    """The adapter that recognises ``module`` (adaptable or not), or None."""
    for adapter in ATTENTION_ADAPTERS:
        if adapter.recognises(module):
            return adapter
    return None


def _adapt(module: nn.Module, options: ConverterOptions, context: dict) -> nn.Module:
    adapter = attention_adapter(module)
    reason = adapter.unsupported(module)
    if reason is not None:
        print(f"warning: attention_backend: {adapter.name} {type(module).__qualname__} keeps its own attention: "
              f"{reason}", file=sys.stderr)
        return module
    return adapter.adapt(module)


def register_attention_adapters(registry: ConversionRegistry) -> None:
    """Register the adapters as one ``attention_backend`` conversion (done once for ``CONVERSIONS``)."""
    registry.register(nn.Module, _adapt, name="attention_backend", enabled=_attention_enabled,
                      describe=_attention_describe, priority=PRIORITY_ADAPTER, include_subclasses=True,
                      when=lambda module: attention_adapter(module) is not None)


register_attention_adapters(CONVERSIONS)
