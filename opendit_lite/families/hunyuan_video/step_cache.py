"""HunyuanVideo's step-cache piece: the caches hook the double-stream blocks then the single-stream ones
as one stack (the token refiner, which runs on the caption before them, stays outside it); TeaCache's
signal is what the first double-stream block (``HunyuanVideoTransformerBlock``) feeds its joint
attention for the video tokens: ``norm1`` (an ``AdaLayerNormZero``) of the tokens and the
timestep embedding."""

from ..step_cache_spec import StepCacheSpec, ada_norm_zero_signal

STEP_CACHE = StepCacheSpec(family="hunyuan_video", head_block="HunyuanVideoTransformerBlock",
                           teacache_signal=ada_norm_zero_signal)
