"""Qwen-Image's step-cache piece: the caches hook ``transformer_blocks`` as one stack; TeaCache's signal
is what the first block (``QwenImageTransformerBlock``) feeds its joint attention for the image tokens:
``img_norm1`` of the tokens modulated by the first half of ``img_mod(temb)`` (through the block's own
``_modulate``, per token where ``zero_cond_t`` modulates the reference tokens apart)."""

import torch

from ..step_cache_spec import StepCacheSpec, forward_arguments


def qwen_image_signal(block, args, kwargs) -> torch.Tensor:
    """The first block's modulated image input [B, N, D], from the arguments it is called with."""
    inputs = forward_arguments(block, args, kwargs)
    img_mod1 = block.img_mod(inputs["temb"]).chunk(2, dim=-1)[0]                     # [B, 3D]
    modulated, _ = block._modulate(block.img_norm1(inputs["hidden_states"]), img_mod1,
                                   inputs.get("modulate_index"))
    return modulated                                                                  # [B, N, D]


STEP_CACHE = StepCacheSpec(family="qwen_image", head_block="QwenImageTransformerBlock",
                           teacache_signal=qwen_image_signal)
