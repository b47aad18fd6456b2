"""Qwen-Image's LoRA adapters under the names ComfyUI and the Qwen-Image trainers use: the released
checkpoint's own module names (Qwen-Image was released in diffusers' layout) under
``diffusion_model.``, with ``lora_down`` / ``lora_up`` / ``alpha`` keys, which diffusers'
``QwenImagePipeline.load_lora_weights`` reads through its non-diffusers converter. Every layer keeps its
name; the layers of the default targets (the image stream's attention and MLP, the text stream's keys
and values) are mapped."""

from ..original_lora_spec import OriginalLoRA

_LAYERS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
           "attn.add_v_proj", "attn.to_add_out", "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj",
           "txt_mlp.net.2")

ORIGINAL_LORA = OriginalLoRA(layers=tuple(
    (f"transformer_blocks.{{i}}.{name}", (f"transformer_blocks.{{i}}.{name}",)) for name in _LAYERS), keys="kohya")
