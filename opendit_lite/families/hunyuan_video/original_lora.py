"""HunyuanVideo's LoRA adapters under the names of Tencent's original checkpoint
(``diffusion_model.double_blocks.{i}.img_attn_qkv``), the layout of ComfyUI and the HunyuanVideo
trainers. The original fuses each stream's q, k, v (``img_attn_qkv``, ``txt_attn_qkv``, the token
refiner's ``self_attn_qkv``) and, in the single blocks, q, k, v and the MLP's input projection
(``linear1``); the fused layer's adapter is their adapters stacked (``original_lora_spec``).

diffusers' ``HunyuanVideoPipeline.load_lora_weights`` reads the file with its HunyuanVideo converter,
which takes peft key names and refuses a key without ``lora`` in it: the matrices are ``lora_A`` /
``lora_B``, the scale alpha / rank folded into ``lora_A``. Two limits of that converter: it splits
``linear1`` by the released width (3 x 3072 + the rest), and it splits the token refiner's
``self_attn_qkv`` ``lora_A`` by rows, which no fused adapter fits; files with those adapters load
in ComfyUI and not there (adapt other layers, or export the diffusers format, for diffusers)."""

from ..original_lora_spec import OriginalLoRA

_DOUBLE = "transformer_blocks.{i}"
_SINGLE = "single_transformer_blocks.{i}"
_REFINER = "context_embedder.token_refiner.refiner_blocks.{i}"

ORIGINAL_LORA = OriginalLoRA(layers=(
    ("double_blocks.{i}.img_attn_qkv", (f"{_DOUBLE}.attn.to_q", f"{_DOUBLE}.attn.to_k", f"{_DOUBLE}.attn.to_v")),
    ("double_blocks.{i}.img_attn_proj", (f"{_DOUBLE}.attn.to_out.0",)),
    ("double_blocks.{i}.img_mlp.fc1", (f"{_DOUBLE}.ff.net.0.proj",)),
    ("double_blocks.{i}.img_mlp.fc2", (f"{_DOUBLE}.ff.net.2",)),
    ("double_blocks.{i}.img_mod.linear", (f"{_DOUBLE}.norm1.linear",)),
    ("double_blocks.{i}.txt_attn_qkv",
     (f"{_DOUBLE}.attn.add_q_proj", f"{_DOUBLE}.attn.add_k_proj", f"{_DOUBLE}.attn.add_v_proj")),
    ("double_blocks.{i}.txt_attn_proj", (f"{_DOUBLE}.attn.to_add_out",)),
    ("double_blocks.{i}.txt_mlp.fc1", (f"{_DOUBLE}.ff_context.net.0.proj",)),
    ("double_blocks.{i}.txt_mlp.fc2", (f"{_DOUBLE}.ff_context.net.2",)),
    ("double_blocks.{i}.txt_mod.linear", (f"{_DOUBLE}.norm1_context.linear",)),
    ("single_blocks.{i}.linear1",
     (f"{_SINGLE}.attn.to_q", f"{_SINGLE}.attn.to_k", f"{_SINGLE}.attn.to_v", f"{_SINGLE}.proj_mlp")),
    ("single_blocks.{i}.linear2", (f"{_SINGLE}.proj_out",)),
    ("single_blocks.{i}.modulation.linear", (f"{_SINGLE}.norm.linear",)),
    ("txt_in.individual_token_refiner.blocks.{i}.self_attn_qkv",
     (f"{_REFINER}.attn.to_q", f"{_REFINER}.attn.to_k", f"{_REFINER}.attn.to_v")),
    ("txt_in.individual_token_refiner.blocks.{i}.self_attn_proj", (f"{_REFINER}.attn.to_out.0",)),
    ("txt_in.individual_token_refiner.blocks.{i}.mlp.fc1", (f"{_REFINER}.ff.net.0.proj",)),
    ("txt_in.individual_token_refiner.blocks.{i}.mlp.fc2", (f"{_REFINER}.ff.net.2",)),
), keys="peft")
