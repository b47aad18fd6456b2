"""Saved activations counted from the model itself, for models without a declared activation profile
(the diffusers families, any model called as the project's video denoiser): one forward on the meta
device (no memory, no weights, any size) at two small clip shapes, with every tensor autograd saves for
backward caught by ``saved_tensors_hooks`` and attributed to the block that was running (or to
"outside the blocks"). Saved bytes are linear in the video tokens (SDPA/flash attention keeps O(N) per
head), so two shapes give, per block, bytes per token (the slope) and bytes that do not grow with the
clip (the caption stream, pooled text, modulation): the model's ``ActivationProfile`` in widths of D,
scaled by the planner to any clip, batch, SP size and checkpointing.

The count runs in the training dtype (the model cast to it on the meta device): what a layer saves in
its own precision (diffusers' FP32LayerNorm keeps an fp32 copy of its input, rotary embeddings work in
fp32 or fp64) is a larger share of a bf16 step than of an fp32 one, so counting in fp32 and halving
would miss it (about 9% of a Wan-1.3B-like step on an H200).

On the meta device torch's SDPA takes its math path, which would save the N x N scores a GPU run never
keeps; while counting, SDPA calls on meta tensors go to the flash kernel's meta function (what CPU and
GPU runs save: q, k, v, the output and the log-sum-exp), a boolean mask turned into the additive mask of
the query's dtype that SDPA builds and saves from it. A mask of [L, L] per sample (HunyuanVideo 1.5's
joint mask) is the one saved tensor that is not linear in the tokens: the two shapes count it as if it
were, which under-predicts it at long sequences (its config states the difference).
"""

import contextlib
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.blocks import find_blocks
from .memory_model import ActivationProfile

COUNT_BYTES = 4  # counted in fp32 unless asked for another dtype


@contextlib.contextmanager
def flash_attention_on_meta():
    """SDPA on meta tensors as the flash kernel (its saved tensors are O(N)); other devices unchanged."""
    real = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if query.device.type != "meta":
            return real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as SDPA takes it: an additive mask in q's dtype
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~attn_mask, float("-inf"))
        if enable_gqa and key.size(-3) != query.size(-3):
            repeat = query.size(-3) // key.size(-3)
            key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real


def saved_bytes_by_block(model: nn.Module, blocks: List[nn.Module], run: Callable[[], torch.Tensor]
                         ) -> Tuple[List[int], int]:
    """(bytes saved for backward inside each block, bytes saved outside the blocks) of one ``run()``;
    parameters are not activations, a storage is counted once (where it was first saved)."""
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    where: Dict[int, Tuple[int, int]] = {}
    current = [-1]

    def pack(t):
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in params and key not in where:
            where[key] = (current[0], storage.nbytes())
        return t

    def enter(i):
        return lambda *_: current.__setitem__(0, i)

    def leave(*_):
        current[0] = -1

    handles = [h for i, b in enumerate(blocks)
               for h in (b.register_forward_pre_hook(enter(i)), b.register_forward_hook(leave))]
    try:
        with flash_attention_on_meta(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
    finally:
        for h in handles:
            h.remove()
    per_block = [0] * len(blocks)
    outside = 0
    for block, nbytes in where.values():
        if block < 0:
            outside += nbytes
        else:
            per_block[block] += nbytes
    return per_block, outside


def counted_profile(model: nn.Module, hidden: int, step: Callable[[int], Callable[[], torch.Tensor]],
                    token_counts: Tuple[int, int], caption_tokens: int,
                    element_bytes: int = COUNT_BYTES) -> ActivationProfile:
    """The model's ``ActivationProfile`` from two runs: ``step(i)`` returns the run at the i-th clip
    shape, of ``token_counts[i]`` video tokens per sample (one sample) and ``caption_tokens`` text tokens.
    Widths are per block (the blocks' mean) in units of ``hidden`` elements of ``element_bytes`` bytes,
    the size of the dtype the runs compute in (their saved tensors' own dtypes are counted as they are:
    a bf16 model's norms that save fp32 copies count double)."""
    blocks = find_blocks(model)
    counts = [saved_bytes_by_block(model, blocks, step(i)) for i in range(2)]
    (b1, o1), (b2, o2) = counts
    n1, n2 = token_counts
    unit = hidden * element_bytes
    per_token = sum(y - x for x, y in zip(b1, b2)) / len(blocks) / (n2 - n1)        # bytes per token per block
    fixed = sum(b1) / len(blocks) - per_token * n1                                  # per block, per sample
    outside_per_token = (o2 - o1) / (n2 - n1)
    outside_fixed = o1 - outside_per_token * n1
    text = max(caption_tokens, 1)
    return ActivationProfile(token_widths=per_token / unit, caption_widths=max(0.0, fixed) / unit / text,
                             outside_widths=outside_per_token / unit,
                             outside_caption_widths=max(0.0, outside_fixed) / unit / text,
                             source="counted from the model's forward on the meta device")


__all__ = ["COUNT_BYTES", "counted_profile", "flash_attention_on_meta", "saved_bytes_by_block"]
