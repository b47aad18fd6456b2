"""Z-Image's step-cache piece: TeaCache's signal is what the first ``ZImageTransformerBlock`` (the
first noise refiner, which sees the image tokens alone) feeds its attention: ``attention_norm1`` of
the tokens times ``1 + scale_msa``, the scale its ``adaLN_modulation`` makes of the timestep
embedding, as the block computes it."""

from ..step_cache_spec import StepCacheSpec, forward_arguments


def modulated_input(block, args, kwargs):
    inputs = forward_arguments(block, args, kwargs)
    x, adaln = inputs["x"], inputs["adaln_input"]                               # [B, N, D], [B, 256]
    scale_msa = block.adaLN_modulation(adaln).unsqueeze(1).chunk(4, dim=2)[0]  # [B, 1, D]
    return block.attention_norm1(x) * (1.0 + scale_msa)                        # [B, N, D]


STEP_CACHE = StepCacheSpec(family="z_image", head_block="ZImageTransformerBlock", teacache_signal=modulated_input)
