"""Wan's LoRA adapters under the names of Wan's original checkpoint (``diffusion_model.blocks.{i}.self_attn.q``),
the layout ComfyUI and the Wan trainers use; diffusers' ``WanPipeline.load_lora_weights`` reads such
a file through its non-diffusers converter (``alpha`` keys included). Every layer is a rename: Wan
fuses nothing. The layers outside the blocks (embedders, head) are not mapped: diffusers' converter
drops their ``alpha``."""

from ..original_lora_spec import OriginalLoRA

_ATTENTION = (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"))

ORIGINAL_LORA = OriginalLoRA(layers=(
    *((f"blocks.{{i}}.self_attn.{o}", (f"blocks.{{i}}.attn1.{d}",)) for o, d in _ATTENTION),
    *((f"blocks.{{i}}.cross_attn.{o}", (f"blocks.{{i}}.attn2.{d}",)) for o, d in _ATTENTION),
    # image-to-video: the cross-attention's image keys and values
    ("blocks.{i}.cross_attn.k_img", ("blocks.{i}.attn2.add_k_proj",)),
    ("blocks.{i}.cross_attn.v_img", ("blocks.{i}.attn2.add_v_proj",)),
    ("blocks.{i}.ffn.0", ("blocks.{i}.ffn.net.0.proj",)),
    ("blocks.{i}.ffn.2", ("blocks.{i}.ffn.net.2",)),
), keys="kohya")
