"""LTX-Video's LoRA adapters under the names of its original checkpoint (``diffusion_model.
transformer_blocks.{i}.attn1.to_q``), the layout of ComfyUI and Lightricks' trainer. The blocks'
linear layers have the same names in both layouts (the original renames only the embedders and
norms), so every entry is the identity; what differs is the prefix. diffusers'
``LTXPipeline.load_lora_weights`` strips it and reads the rest as peft keys, refusing any key
without ``lora`` in it, so the file names the matrices ``lora_A`` / ``lora_B`` with the scale
alpha / rank folded into ``lora_A`` (no ``alpha`` key)."""

from ..original_lora_spec import OriginalLoRA

_LAYERS = tuple(f"transformer_blocks.{{i}}.{attention}.{name}" for attention in ("attn1", "attn2")
                for name in ("to_q", "to_k", "to_v", "to_out.0")) + (
    "transformer_blocks.{i}.ff.net.0.proj", "transformer_blocks.{i}.ff.net.2")

ORIGINAL_LORA = OriginalLoRA(layers=tuple((layer, (layer,)) for layer in _LAYERS), keys="peft")
