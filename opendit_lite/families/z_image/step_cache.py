"""Z-Image's step-cache piece. Its forward runs three streams through one block class in turn: the image
tokens through ``noise_refiner``, the caption through ``context_refiner``, then the joint sequence through
``layers``. The block-level caches (First-Block-Cache, MagCache, TeaCache) hook ``layers`` alone, the one
stack its tokens run through as one stream (``cache_block_lists``: diffusers' own hooks pick the same
list); the refiners (two blocks each in the release, against 30 layers) run at every step. The blocks
take their tokens as ``x`` and return them alone (``block_streams``), where diffusers' registry entry for
``ZImageTransformerBlock`` reads ``hidden_states``.

TeaCache's signal is what the first main layer feeds its attention: ``attention_norm1`` of the joint
tokens times ``1 + scale_msa``, the scale its ``adaLN_modulation`` makes of the timestep embedding.
"""

from ..step_cache_spec import StepCacheSpec, forward_arguments


def modulated_input(block, args, kwargs):
    inputs = forward_arguments(block, args, kwargs)
    x, adaln = inputs["x"], inputs["adaln_input"]                               # [B, N, D], [B, 256]
    scale_msa = block.adaLN_modulation(adaln).unsqueeze(1).chunk(4, dim=2)[0]  # [B, 1, D]
    return block.attention_norm1(x) * (1.0 + scale_msa)                        # [B, N, D]


STEP_CACHE = StepCacheSpec(family="z_image", head_block="ZImageTransformerBlock", teacache_signal=modulated_input,
                           cache_block_lists=("layers",), block_streams=("x",))
