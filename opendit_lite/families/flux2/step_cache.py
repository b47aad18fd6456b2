"""FLUX.2's step-cache piece: the caches hook the double-stream blocks then the single-stream ones as one
stack (diffusers registers both block classes in its ``TransformerBlockRegistry``); TeaCache's signal
is what the first double-stream block (``Flux2TransformerBlock``) feeds its joint attention for the
image tokens: its affine-free ``norm1`` of the tokens, modulated by the first (shift, scale) of the
image stream's modulation (``temb_mod_img``, computed once per forward by the model)."""

from ..step_cache_spec import StepCacheSpec, forward_arguments


def modulated_norm1_signal(block, args, kwargs):
    """``(1 + scale_msa) * norm1(hidden_states) + shift_msa`` of a ``Flux2TransformerBlock`` call. [B, N, D]."""
    from diffusers.models.transformers.transformer_flux2 import Flux2Modulation

    inputs = forward_arguments(block, args, kwargs)
    (shift_msa, scale_msa, _), _ = Flux2Modulation.split(inputs["temb_mod_img"], 2)
    return (1 + scale_msa) * block.norm1(inputs["hidden_states"]) + shift_msa


STEP_CACHE = StepCacheSpec(family="flux2", head_block="Flux2TransformerBlock", teacache_signal=modulated_norm1_signal)
