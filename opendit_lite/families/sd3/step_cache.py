"""SD3's step-cache piece: TeaCache's signal is what the first ``JointTransformerBlock`` feeds its joint
attention for the image tokens: ``norm1`` (``AdaLayerNormZero``, or SD3.5's dual-attention
``SD35AdaLayerNormZeroX``, whose first output is the same tensor) of the tokens and the timestep
embedding. The last block reads the text stream without returning it (``context_pre_only``): the
block-level caches pass the text through it unchanged."""

from ..step_cache_spec import StepCacheSpec, ada_norm_zero_signal

STEP_CACHE = StepCacheSpec(family="sd3", head_block="JointTransformerBlock", teacache_signal=ada_norm_zero_signal)
