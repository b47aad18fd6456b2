"""Wan's step-cache piece: TeaCache's signal is what ``WanTransformerBlock`` feeds its self-attention,
``norm1`` of the tokens modulated by the block's shift and scale (``scale_shift_table + temb``: per
sample [B, 6, D], or per token [B, N, 6, D] with Wan 2.2's per-token timesteps), in fp32 as the block
computes it; through ``norm_modulate``, so a block whose norms the ``fused_adaln`` conversion fused
gives the same tensor."""

from ...converter.adaln_protocol import norm_modulate
from ..step_cache_spec import StepCacheSpec, forward_arguments


def modulated_input(block, args, kwargs):
    inputs = forward_arguments(block, args, kwargs)
    hidden, temb = inputs["hidden_states"], inputs["temb"]                     # [B, N, D], [B, (N,) 6, D]
    if temb.ndim == 4:                                                          # per token: 2 x [B, N, D]
        shift, scale = (block.scale_shift_table.unsqueeze(0) + temb.float()).unbind(2)[:2]
    else:                                                                       # per sample: 2 x [B, 1, D]
        shift, scale = (block.scale_shift_table + temb.float()).chunk(6, dim=1)[:2]
    return norm_modulate(block.norm1, hidden.float(), shift, scale)            # [B, N, D]


STEP_CACHE = StepCacheSpec(family="wan", head_block="WanTransformerBlock", teacache_signal=modulated_input)
