"""Flux's step-cache piece: the caches hook the double-stream blocks then the single-stream ones as one
stack; TeaCache's signal is what the first double-stream block (``FluxTransformerBlock``) feeds its
joint attention for the image tokens: ``norm1`` (an ``AdaLayerNormZero``) of the tokens and the
timestep-and-guidance embedding."""

from ..step_cache_spec import StepCacheSpec, ada_norm_zero_signal

STEP_CACHE = StepCacheSpec(family="flux", head_block="FluxTransformerBlock", teacache_signal=ada_norm_zero_signal)
