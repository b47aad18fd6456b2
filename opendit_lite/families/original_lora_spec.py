"""The original-layout piece of a family (``<family>/original_lora.py``): the names its LoRA adapters
take in the family's original checkpoint (the layout the model was released in before diffusers
converted it, which ComfyUI and the community trainers use), so that ``export.lora_format: comfyui``
writes a file those tools read and diffusers' own non-diffusers LoRA converters turn back into the
adapters trained here (``interop.comfyui_lora``).

Each entry names one linear layer of the original checkpoint and the diffusers layers it holds, in
the order of its output rows: one layer for a plain rename (Wan's ``blocks.{i}.self_attn.q`` is
diffusers' ``blocks.{i}.attn1.to_q``), several where the original fuses them (Flux's
``double_blocks.{i}.img_attn.qkv`` stacks ``to_q``, ``to_k`` and ``to_v``; its single blocks'
``linear1`` stacks those and ``proj_mlp``). ``{i}`` stands for a block index. A fused layer's adapter
is written as one LoRA of the summed rank (the parts' down matrices stacked, the up matrix block
diagonal), which is exact: ``up @ down`` is the parts' updates stacked.

``keys`` says how the family's loaders name the two matrices and the scale:

* ``"kohya"``: ``<layer>.lora_down.weight``, ``<layer>.lora_up.weight`` and ``<layer>.alpha`` (the
  update is ``alpha / rank * up @ down``; Wan's, Flux's and SD3's files, and what ComfyUI reads for
  every family);
* ``"kohya_dotted"``: ``<layer>.lora.down.weight``, ``<layer>.lora.up.weight`` and ``<layer>.alpha``
  (kohya's with dots: the form Z-Image's diffusers converter splits a fused ``qkv`` in; ComfyUI reads it);
* ``"peft"``: ``<layer>.lora_A.weight`` and ``<layer>.lora_B.weight`` and no alpha, the scale folded
  into ``lora_A`` (HunyuanVideo's and LTX-Video's diffusers loaders refuse a key without ``lora``
  in it, so an ``.alpha`` key would make the file unreadable there).

A family without an original layout that a LoRA tool reads declares ``original_lora=None`` in its
record; the export then refuses ``comfyui`` by name.
"""

from dataclasses import dataclass
from typing import Tuple

KEY_STYLES = ("kohya", "kohya_dotted", "peft")


@dataclass(frozen=True)
class OriginalLoRA:
    """A family's original-layout LoRA names (see the module docstring)."""

    # (original layer, the diffusers layers it holds in the order of its output rows); "{i}": a block index
    layers: Tuple[Tuple[str, Tuple[str, ...]], ...]
    keys: str = "kohya"                    # how the matrices and the scale are named: one of KEY_STYLES
    prefix: str = "diffusion_model."       # the prefix of every key (the original checkpoint's module)

    def __post_init__(self):
        if self.keys not in KEY_STYLES:
            raise ValueError(f"OriginalLoRA.keys={self.keys!r}: use one of {', '.join(KEY_STYLES)}")
        seen = [part for _, parts in self.layers for part in parts]
        if len(set(seen)) != len(seen) or any(not parts for _, parts in self.layers):
            raise ValueError("OriginalLoRA.layers: each diffusers layer belongs to exactly one original layer")
