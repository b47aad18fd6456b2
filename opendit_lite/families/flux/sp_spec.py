"""Flux's sequence-parallel spec (diffusers 0.42's ``FluxTransformer2DModel``): the image tokens are
made by ``x_embedder`` on the packed latents; the text joins them in joint [text, image] attention
(the double blocks' processor; the single blocks concatenate first); split with the tokens:
``img_ids`` [N, 3], before ``pos_embed`` builds the rotary table of cat(txt, img).
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt

SP_SPEC = FamilySpec(
    family="flux", cls_name="FluxTransformer2DModel",
    splits=(SplitAt("", inputs={"hidden_states": Split(1, 3), "img_ids": Split(0, 2)}),),   # [B, N, C], [N, 3]
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("transformer_blocks.*.attn", "joint", ("FluxAttnProcessor",), text="first"),
               AttentionSpec("single_transformer_blocks.*.attn", "joint", ("FluxAttnProcessor",), text="first")),
    why_not_diffusers_cp="its _cp_plan shards the text too (text length must divide sp_size) and pads nothing",
)
