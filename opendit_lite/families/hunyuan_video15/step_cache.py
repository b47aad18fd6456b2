"""HunyuanVideo 1.5's step-cache piece: the caches hook its one stack of double-stream blocks
(``transformer_blocks``; the token refiner runs on the caption before them, outside it); TeaCache's
signal is what the first block (``HunyuanVideo15TransformerBlock``) feeds its joint attention for the
video tokens: ``norm1`` (an ``AdaLayerNormZero``) of the tokens and the timestep embedding. diffusers
0.42's ``TransformerBlockRegistry`` has no entry for the block, so its streams are declared
(``block_streams``: it takes and returns the tokens, then the text)."""

from ..step_cache_spec import StepCacheSpec, ada_norm_zero_signal

STEP_CACHE = StepCacheSpec(family="hunyuan_video15", head_block="HunyuanVideo15TransformerBlock",
                           teacache_signal=ada_norm_zero_signal,
                           block_streams=("hidden_states", "encoder_hidden_states"))
