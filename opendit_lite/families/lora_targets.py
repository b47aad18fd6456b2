"""The layer names the families' LoRA targets are built from: the linear layers diffusers' LoRA
training scripts adapt (``to_q``, ``to_k``, ``to_v``, ``to_out.0`` of every attention, the text
stream's ``add_*_proj`` / ``to_add_out`` in the joint-attention families, and the feed-forward
layers), as ``models.lora.lora_target_names`` patterns: a name matches itself and any ``.<name>``
suffix, so ``to_q`` covers ``attn.to_q``, ``attn1.to_q``, ``attn2.to_q``; a regular expression names
the single-stream blocks' ``proj_out`` without the model's final output projection, which also ends
in ``proj_out``. Each family's own tuple is in its ``__init__.py`` (``Family.lora_targets``).
"""

ATTENTION = ("to_q", "to_k", "to_v", "to_out.0")
JOINT_ATTENTION = ATTENTION + ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
FEED_FORWARD = ("ff.net.0.proj", "ff.net.2")
CONTEXT_FEED_FORWARD = ("ff_context.net.0.proj", "ff_context.net.2")
SINGLE_STREAM_MLP = ("proj_mlp", r"single_transformer_blocks\.\d+\.proj_out")
# FLUX.2: SwiGLU feed-forwards (linear_in, linear_out) per stream; the single blocks' fused
# attention-and-MLP projections (to_qkv_mlp_proj in, attn.to_out out: a Linear, not to_out.0).
SWIGLU_FEED_FORWARD = ("ff.linear_in", "ff.linear_out")
CONTEXT_SWIGLU_FEED_FORWARD = ("ff_context.linear_in", "ff_context.linear_out")
PARALLEL_SINGLE_STREAM = ("to_qkv_mlp_proj", r"single_transformer_blocks\.\d+\.attn\.to_out")
