"""What the project declares about the diffusers transformers trained today (Wan, Flux, SD3,
CogVideoX, HunyuanVideo, LTX-Video), which cannot declare capabilities themselves: declared by
class name (``capabilities.declare_capabilities``), so nothing here imports diffusers.

* ``block_lists``: the block lists in the order the forward runs them, the unit of activation
  checkpointing, offload and per-block compile (``blocks.find_blocks``). diffusers' own
  ``_repeated_blocks`` is not used: it names classes, HunyuanVideo's include the patch embedding
  and the token refiner, and SD3 has none.
* ``lora_targets``: the linear layers diffusers' LoRA training scripts adapt (``to_q``, ``to_k``,
  ``to_v``, ``to_out.0`` of every attention, the text stream's ``add_*_proj`` / ``to_add_out`` in
  the joint-attention families, and the feed-forward layers), as ``lora_target_names`` patterns: a
  name matches itself and any ``.<name>`` suffix, so ``to_q`` covers ``attn.to_q``, ``attn1.to_q``,
  ``attn2.to_q``; a regular expression names the single-stream blocks' ``proj_out`` without the
  model's final output projection, which also ends in ``proj_out``.
"""

from .capabilities import declare_capabilities

TRANSFORMERS = "diffusers.models.transformers"

ATTENTION = ("to_q", "to_k", "to_v", "to_out.0")
JOINT_ATTENTION = ATTENTION + ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
FEED_FORWARD = ("ff.net.0.proj", "ff.net.2")
CONTEXT_FEED_FORWARD = ("ff_context.net.0.proj", "ff_context.net.2")
SINGLE_STREAM_MLP = ("proj_mlp", r"single_transformer_blocks\.\d+\.proj_out")

FAMILIES = {
    # class path: (block lists, LoRA targets)
    f"{TRANSFORMERS}.transformer_wan.WanTransformer3DModel": (
        ("blocks",), ATTENTION + ("ffn.net.0.proj", "ffn.net.2")),
    f"{TRANSFORMERS}.transformer_flux.FluxTransformer2DModel": (
        ("transformer_blocks", "single_transformer_blocks"),
        JOINT_ATTENTION + FEED_FORWARD + CONTEXT_FEED_FORWARD + SINGLE_STREAM_MLP),
    f"{TRANSFORMERS}.transformer_sd3.SD3Transformer2DModel": (
        ("transformer_blocks",), JOINT_ATTENTION + FEED_FORWARD + CONTEXT_FEED_FORWARD),
    f"{TRANSFORMERS}.cogvideox_transformer_3d.CogVideoXTransformer3DModel": (
        ("transformer_blocks",), ATTENTION + FEED_FORWARD),
    f"{TRANSFORMERS}.transformer_hunyuan_video.HunyuanVideoTransformer3DModel": (
        ("transformer_blocks", "single_transformer_blocks"),
        JOINT_ATTENTION + FEED_FORWARD + CONTEXT_FEED_FORWARD + SINGLE_STREAM_MLP),
    f"{TRANSFORMERS}.transformer_ltx.LTXVideoTransformer3DModel": (
        ("transformer_blocks",), ATTENTION + FEED_FORWARD),
}

for _path, (_lists, _targets) in FAMILIES.items():
    declare_capabilities(_path, block_lists=_lists, lora_targets=_targets)
