"""Z-Image's step-cache piece: no step cache hooks its blocks (``no_cache``). Its forward runs three
streams through one block class in turn: the image tokens through ``noise_refiner``, the caption
through ``context_refiner``, then the joint sequence through ``layers``; the block-level caches
(First-Block-Cache, MagCache, TeaCache) treat the declared block lists as one stack whose head output
and tail output are one stream, and diffusers' ``TransformerBlockRegistry`` entry for
``ZImageTransformerBlock`` names the tokens ``hidden_states`` where the block takes ``x``; Pyramid
Attention Broadcast finds no ``attn`` module in it (its attention is ``attention``). Sampling through
``ZImagePipeline`` (a run from its folder) uses no step cache anyway.

TeaCache's signal itself is what the first block (the first noise refiner) feeds its attention:
``attention_norm1`` of the tokens times ``1 + scale_msa``, the scale its ``adaLN_modulation`` makes of
the timestep embedding, kept for a cache that hooks the main layers alone.
"""

from ..step_cache_spec import StepCacheSpec, forward_arguments


def modulated_input(block, args, kwargs):
    inputs = forward_arguments(block, args, kwargs)
    x, adaln = inputs["x"], inputs["adaln_input"]                               # [B, N, D], [B, 256]
    scale_msa = block.adaLN_modulation(adaln).unsqueeze(1).chunk(4, dim=2)[0]  # [B, 1, D]
    return block.attention_norm1(x) * (1.0 + scale_msa)                        # [B, N, D]


STEP_CACHE = StepCacheSpec(
    family="z_image", head_block="ZImageTransformerBlock", teacache_signal=modulated_input,
    no_cache="its blocks run the image tokens, the caption and the joint sequence in turn (three streams through "
             "one block class, the tokens named x), which the block-level caches' one-stack hooks and Pyramid "
             "Attention Broadcast cannot follow.")
