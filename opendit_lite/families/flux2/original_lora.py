"""FLUX.2's LoRA adapters under the names of Black Forest Labs' original checkpoint
(``diffusion_model.double_blocks.{i}.img_attn.qkv``), the layout of ComfyUI and ai-toolkit. The
double blocks fuse each stream's q, k, v into one ``qkv`` layer (the fused layer's adapter is theirs
stacked, ``original_lora_spec``); the single blocks' ``linear1`` / ``linear2`` are diffusers' already
fused ``attn.to_qkv_mlp_proj`` / ``attn.to_out`` renamed. The keys are ``lora_A`` / ``lora_B`` with the
scale folded into ``lora_A``: ``Flux2Pipeline.lora_state_dict`` sends any file with a ``lora_down`` key
to its ``lora_unet_``-named kohya converter (which reads no ``diffusion_model.`` key), and its
``diffusion_model.`` converter refuses an ``alpha`` key. That converter reads every layer mapped here at
any width (it chunks ``qkv`` in three equal parts, as q, k and v are)."""

from ..original_lora_spec import OriginalLoRA

_DOUBLE = "transformer_blocks.{i}"
_SINGLE = "single_transformer_blocks.{i}"

ORIGINAL_LORA = OriginalLoRA(layers=(
    ("double_blocks.{i}.img_attn.qkv", (f"{_DOUBLE}.attn.to_q", f"{_DOUBLE}.attn.to_k", f"{_DOUBLE}.attn.to_v")),
    ("double_blocks.{i}.img_attn.proj", (f"{_DOUBLE}.attn.to_out.0",)),
    ("double_blocks.{i}.txt_attn.qkv",
     (f"{_DOUBLE}.attn.add_q_proj", f"{_DOUBLE}.attn.add_k_proj", f"{_DOUBLE}.attn.add_v_proj")),
    ("double_blocks.{i}.txt_attn.proj", (f"{_DOUBLE}.attn.to_add_out",)),
    ("double_blocks.{i}.img_mlp.0", (f"{_DOUBLE}.ff.linear_in",)),
    ("double_blocks.{i}.img_mlp.2", (f"{_DOUBLE}.ff.linear_out",)),
    ("double_blocks.{i}.txt_mlp.0", (f"{_DOUBLE}.ff_context.linear_in",)),
    ("double_blocks.{i}.txt_mlp.2", (f"{_DOUBLE}.ff_context.linear_out",)),
    ("single_blocks.{i}.linear1", (f"{_SINGLE}.attn.to_qkv_mlp_proj",)),
    ("single_blocks.{i}.linear2", (f"{_SINGLE}.attn.to_out",)),
), keys="peft")
