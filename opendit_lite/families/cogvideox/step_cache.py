"""CogVideoX's step-cache piece: TeaCache's signal is what the first ``CogVideoXBlock`` feeds its joint
attention for the video tokens: the first output of ``norm1`` (``CogVideoXLayerNormZero``, which
normalises and modulates the video and the text stream with the timestep embedding)."""

from ..step_cache_spec import StepCacheSpec, forward_arguments


def modulated_input(block, args, kwargs):
    inputs = forward_arguments(block, args, kwargs)
    return block.norm1(inputs["hidden_states"], inputs["encoder_hidden_states"], inputs["temb"])[0]  # [B, N, D]


STEP_CACHE = StepCacheSpec(family="cogvideox", head_block="CogVideoXBlock", teacache_signal=modulated_input)
