"""The diffusers families' attention core through the package's op seam: each attention module runs its
own diffusers processor unchanged, and the processor's ``scaled_dot_product_attention`` call is
routed to the module's ``attn_op`` (the sequence-parallel op of its role and mode).

Why intercept the SDPA call rather than install processors of our own: the six families' processors
hold the family-specific projections, QK norms, rotary embeddings and text concatenation (Flux's fused
single-block projections, HunyuanVideo's added projections, CogVideoX's rope on the image part only,
SD3.5's dual attention, Wan's image context), which change between diffusers releases; writing six
processors again would copy that code and drift from it. The only step sequence parallelism changes is
the softmax core, and every family reaches it through one call: diffusers' native attention backend
(``dispatch_attention_fn``) and the processors that call SDPA directly (CogVideoX, SD3) both end in
``torch.nn.functional.scaled_dot_product_attention``. A ``TorchFunctionMode`` active only during the
attention module's own forward catches that call (and only that call: the mode is off while the
handler runs, so the op's inner SDPA runs plainly), and the projections stay diffusers' own.

It must fail loudly where a processor does not end in SDPA, and does: at conversion, a processor class
the family's spec does not declare (IP-adapter, custom, fused variants) or an attention backend other
than native SDPA (``set_attention_backend("flash")``, ``DIFFUSERS_ATTN_BACKEND``) is refused by name;
at run time, an attention module whose forward made no SDPA call stops the step, as does a call with
causal masking, GQA, dropout, a non-default scale or a query-dependent mask in self/joint attention.

Shapes at the intercept (SDPA layout ``[B, H, L, Dh]``), n = this rank's ceil(N / P) image tokens:

* self:  L = n for q, k and v; a key mask ``[B|1, 1|H, 1, n]`` is gathered to the whole sequence;
* joint: L = M + n, text first (Flux, CogVideoX) or last (HunyuanVideo, SD3); text-last calls are
  reordered to text-first for the op (``parallel/joint.py``) and back; a mask over queries and keys
  (HunyuanVideo 1.5's ``valid[i] & valid[j]``, declared ``query_mask``) runs as its key mask: only the
  rows of masked text queries change, which no output reads;
* cross: q has n tokens, k/v the M text tokens (whole on every rank): local, masks as given.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from opendit_lite.errors import SequenceParallelError

from ..comm import gather_no_grad


class _SDPAIntercept(TorchFunctionMode):
    """Route ``F.scaled_dot_product_attention`` to ``handler``; everything else runs as usual."""

    def __init__(self, handler):
        super().__init__()
        self.handler = handler

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self.handler(*args, **kwargs)
        return func(*args, **kwargs)


def _as_4d(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """An SDPA mask with its broadcast dimensions made explicit: ``[B|1, H|1, Lq|1, Lk]``."""
    if mask is None:
        return None
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask


class InterceptedAttention:
    """Mixed into a diffusers attention module's class (``swap_class``): its forward runs with the SDPA
    call routed by role. The instance carries ``attn_op`` (child module), ``sequence_parallel_role``
    ("self" | "joint" | "cross"), ``sequence_parallel_text`` ("first" | "last" | None) and
    ``sequence_parallel_name`` (its path, for messages)."""

    class_prefix = "SequenceParallel"

    def forward(self, *args, **kwargs):
        calls = self.attn_op.state.intercepts
        with _SDPAIntercept(self._sequence_parallel_sdpa):
            out = super().forward(*args, **kwargs)
        if self.attn_op.state.intercepts == calls:
            processor = getattr(self, "processor", None)
            raise SequenceParallelError(
                f"attention module '{self.sequence_parallel_name}' ran without calling torch's "
                f"scaled_dot_product_attention (its processor {type(processor).__name__} or attention backend "
                f"{getattr(processor, '_attention_backend', None)!r} bypasses it), so it could not run "
                f"sequence-parallel: use the native attention backend (model.reset_attention_backend()) and the "
                f"family's own processor")
        return out

    def _refuse(self, what: str) -> SequenceParallelError:
        return SequenceParallelError(f"attention module '{self.sequence_parallel_name}' "
                                     f"({self.sequence_parallel_role} attention) called SDPA with {what}, which "
                                     f"sequence parallelism does not run; train it with sp_size=1")

    def _key_mask(self, mask: torch.Tensor, text: int) -> torch.Tensor:
        """A query-dependent mask [B|1, H|1, L, L] of a spec declaring ``query_mask`` -> its key mask
        [B|1, H|1, 1, L], when it is ``valid[i] & valid[j]`` with every image query valid (the row of an
        image query is then the key mask); anything else is refused."""
        shape = tuple(mask.shape)
        if not getattr(self, "sequence_parallel_query_mask", False) or mask.dtype != torch.bool:
            raise self._refuse(f"a query-dependent mask of shape {shape} (only key masks are sharded)")
        image = slice(text, None) if self.sequence_parallel_text == "first" else slice(0, mask.size(-1) - text)
        valid = mask.diagonal(dim1=-2, dim2=-1)                                         # [B|1, H|1, L]
        keys = valid.unsqueeze(-2)                                                      # [B|1, H|1, 1, L]
        # The form is checked on the module's first call only: the check reads the mask on the host (a sync)
        # and builds an [L, L] comparison, and the model builds its mask the same way at every call.
        if not getattr(self, "_query_mask_checked", False):
            if not valid[..., image].all() or not torch.equal(mask, valid.unsqueeze(-1) & keys):
                raise self._refuse(f"a mask of shape {shape} that is not valid[query] & valid[key] with valid "
                                   f"image queries")
            self._query_mask_checked = True
        return keys

    def _sequence_parallel_sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                scale=None, enable_gqa=False):
        # query, key, value: [B, H, L, Dh] (SDPA layout), this rank's local tokens
        state = self.attn_op.state
        state.intercepts += 1
        if is_causal or enable_gqa or key.size(1) != query.size(1):
            raise self._refuse("causal masking or grouped-query heads")
        if dropout_p > 0:
            raise self._refuse(f"attention dropout p={dropout_p}")
        if scale is not None and not math.isclose(scale, query.size(-1) ** -0.5, rel_tol=1e-6):
            raise self._refuse(f"scale={scale} (not 1/sqrt(head_dim))")
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))                    # [B, L, H, Dh]
        mask = _as_4d(attn_mask)
        role, local = self.sequence_parallel_role, state.padded_len() // state.size
        if role == "cross":
            if q.size(1) != local:
                raise self._refuse(f"{q.size(1)} queries where this rank holds {local} image tokens")
            return self.attn_op(q, k, v, attn_mask=mask).transpose(1, 2)                # [B, H, n, Dh]
        if mask is not None and mask.size(-2) != 1:
            mask = self._key_mask(mask, q.size(1) - local)
        if role == "self":
            if q.size(1) != local or k.size(1) != local:
                raise self._refuse(f"{q.size(1)} queries / {k.size(1)} keys where this rank holds {local} tokens")
            if mask is not None:                          # this shard's key mask -> the whole sequence's
                mask = gather_no_grad(mask, state.group, dim=-1, length=state.seq_len)
            return self.attn_op(q, k, v, attn_mask=mask).transpose(1, 2)
        text = q.size(1) - local
        if text < 0 or k.size(1) != q.size(1):
            raise self._refuse(f"{q.size(1)} queries / {k.size(1)} keys for {local} image tokens plus text")
        if self.sequence_parallel_text == "last":         # [image; text] -> [text; image] for the op, and back
            q, k, v = (torch.cat([t[:, local:], t[:, :local]], dim=1) for t in (q, k, v))
            if mask is not None:
                mask = torch.cat([mask[..., local:], mask[..., :local]], dim=-1)
            out = self.attn_op(q, k, v, attn_mask=mask)                               # [B, M + n, H, Dh]
            out = torch.cat([out[:, text:], out[:, :text]], dim=1)
        else:
            out = self.attn_op(q, k, v, attn_mask=mask)
        return out.transpose(1, 2)                                                    # [B, H, L, Dh]
