"""Flux's LoRA adapters under the names of Black Forest Labs' original checkpoint
(``diffusion_model.double_blocks.{i}.img_attn.qkv``), the layout of ComfyUI, kohya's sd-scripts and
ai-toolkit. The original fuses each stream's q, k, v into one ``qkv`` layer and, in the single
blocks, q, k, v and the MLP's input projection into ``linear1``; the fused layer's adapter is their
adapters stacked (``original_lora_spec``). diffusers' ``FluxPipeline.load_lora_weights`` reads the
file with its kohya converter (``alpha`` keys included), which splits ``linear1`` by the released
model's widths (3072 x 3 + 12288): a ``linear1`` adapter of a model of another width loads in
ComfyUI but not there. The final layer is not mapped (diffusers' converter drops its ``alpha``)."""

from ..original_lora_spec import OriginalLoRA

_DOUBLE = "transformer_blocks.{i}"
_SINGLE = "single_transformer_blocks.{i}"

ORIGINAL_LORA = OriginalLoRA(layers=(
    ("double_blocks.{i}.img_attn.qkv", (f"{_DOUBLE}.attn.to_q", f"{_DOUBLE}.attn.to_k", f"{_DOUBLE}.attn.to_v")),
    ("double_blocks.{i}.img_attn.proj", (f"{_DOUBLE}.attn.to_out.0",)),
    ("double_blocks.{i}.img_mlp.0", (f"{_DOUBLE}.ff.net.0.proj",)),
    ("double_blocks.{i}.img_mlp.2", (f"{_DOUBLE}.ff.net.2",)),
    ("double_blocks.{i}.img_mod.lin", (f"{_DOUBLE}.norm1.linear",)),
    ("double_blocks.{i}.txt_attn.qkv",
     (f"{_DOUBLE}.attn.add_q_proj", f"{_DOUBLE}.attn.add_k_proj", f"{_DOUBLE}.attn.add_v_proj")),
    ("double_blocks.{i}.txt_attn.proj", (f"{_DOUBLE}.attn.to_add_out",)),
    ("double_blocks.{i}.txt_mlp.0", (f"{_DOUBLE}.ff_context.net.0.proj",)),
    ("double_blocks.{i}.txt_mlp.2", (f"{_DOUBLE}.ff_context.net.2",)),
    ("double_blocks.{i}.txt_mod.lin", (f"{_DOUBLE}.norm1_context.linear",)),
    ("single_blocks.{i}.linear1",
     (f"{_SINGLE}.attn.to_q", f"{_SINGLE}.attn.to_k", f"{_SINGLE}.attn.to_v", f"{_SINGLE}.proj_mlp")),
    ("single_blocks.{i}.linear2", (f"{_SINGLE}.proj_out",)),
    ("single_blocks.{i}.modulation.lin", (f"{_SINGLE}.norm.linear",)),
), keys="kohya")
