"""Z-Image's LoRA adapters under the names of the single-file checkpoint ComfyUI loads
(``diffusion_model.layers.{i}.attention.qkv``; its NextDiT modules): every block (``noise_refiner``,
``context_refiner``, ``layers``) fuses the attention's q, k, v into ``attention.qkv`` (the fused
layer's adapter is theirs stacked, ``original_lora_spec``) and names the output projection
``attention.out``; the SwiGLU ``feed_forward.w1/w2/w3`` keep diffusers' names. Keys are kohya's with
dots (``lora.down`` / ``lora.up`` / ``alpha``): the form ``ZImagePipeline.load_lora_weights`` reads through
its non-diffusers converter with the fused ``qkv`` split into ``to_q/k/v`` (its kohya form with
underscores leaves ``qkv`` unsplit) and ``attention.out`` renamed to ``to_out.0``; ComfyUI reads both."""

from ..original_lora_spec import OriginalLoRA

_BLOCKS = ("noise_refiner", "context_refiner", "layers")

ORIGINAL_LORA = OriginalLoRA(layers=tuple(
    entry for block in _BLOCKS for entry in (
        (f"{block}.{{i}}.attention.qkv", tuple(f"{block}.{{i}}.attention.to_{p}" for p in "qkv")),
        (f"{block}.{{i}}.attention.out", (f"{block}.{{i}}.attention.to_out.0",)),
        *((f"{block}.{{i}}.feed_forward.{w}", (f"{block}.{{i}}.feed_forward.{w}",)) for w in ("w1", "w2", "w3")),
    )),
    keys="kohya_dotted")
