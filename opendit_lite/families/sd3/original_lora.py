"""SD3's LoRA adapters under the names of Stability AI's original MMDiT checkpoint
(``diffusion_model.joint_blocks.{i}.x_block.attn.qkv``), the layout ComfyUI reads. The original
fuses each stream's q, k, v into one ``qkv`` layer (SD3.5's second image attention too); the fused
layer's adapter is their adapters stacked (``original_lora_spec``). diffusers has no converter for
SD3 LoRA files in this layout (``StableDiffusion3Pipeline.load_lora_weights`` reads the diffusers
format only), so the file is checked against what diffusers' single-file checkpoint converter does
to these layers (``qkv`` chunked in three). The modulation layers are not mapped: the last block's
context modulation has scale and shift swapped in the original."""

from ..original_lora_spec import OriginalLoRA

_BLOCK = "transformer_blocks.{i}"

ORIGINAL_LORA = OriginalLoRA(layers=(
    ("joint_blocks.{i}.x_block.attn.qkv", (f"{_BLOCK}.attn.to_q", f"{_BLOCK}.attn.to_k", f"{_BLOCK}.attn.to_v")),
    ("joint_blocks.{i}.x_block.attn.proj", (f"{_BLOCK}.attn.to_out.0",)),
    ("joint_blocks.{i}.x_block.attn2.qkv", (f"{_BLOCK}.attn2.to_q", f"{_BLOCK}.attn2.to_k", f"{_BLOCK}.attn2.to_v")),
    ("joint_blocks.{i}.x_block.attn2.proj", (f"{_BLOCK}.attn2.to_out.0",)),
    ("joint_blocks.{i}.x_block.mlp.fc1", (f"{_BLOCK}.ff.net.0.proj",)),
    ("joint_blocks.{i}.x_block.mlp.fc2", (f"{_BLOCK}.ff.net.2",)),
    ("joint_blocks.{i}.context_block.attn.qkv",
     (f"{_BLOCK}.attn.add_q_proj", f"{_BLOCK}.attn.add_k_proj", f"{_BLOCK}.attn.add_v_proj")),
    ("joint_blocks.{i}.context_block.attn.proj", (f"{_BLOCK}.attn.to_add_out",)),
    ("joint_blocks.{i}.context_block.mlp.fc1", (f"{_BLOCK}.ff_context.net.0.proj",)),
    ("joint_blocks.{i}.context_block.mlp.fc2", (f"{_BLOCK}.ff_context.net.2",)),
), keys="kohya")
