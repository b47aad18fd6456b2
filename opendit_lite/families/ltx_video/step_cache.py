"""LTX-Video's step-cache piece: TeaCache's signal is what the first ``LTXVideoTransformerBlock`` feeds
its self-attention: ``norm1`` (an affine-free RMSNorm) of the tokens, modulated by the block's
shift and scale (``scale_shift_table + temb``, per token: temb is [B, N', 6 D] with N' 1 or N)."""

from ..step_cache_spec import StepCacheSpec, forward_arguments


def modulated_input(block, args, kwargs):
    inputs = forward_arguments(block, args, kwargs)
    hidden, temb = inputs["hidden_states"], inputs["temb"]                              # [B, N, D], [B, N', 6D]
    table = block.scale_shift_table                                                     # [6, D]
    ada = table[None, None].to(temb.device) + temb.reshape(temb.shape[0], temb.shape[1], table.shape[0], -1)
    shift, scale = ada.unbind(dim=2)[:2]                                                # 2 x [B, N', D]
    return block.norm1(hidden) * (1 + scale) + shift                                    # [B, N, D]


STEP_CACHE = StepCacheSpec(family="ltx_video", head_block="LTXVideoTransformerBlock", teacache_signal=modulated_input)
