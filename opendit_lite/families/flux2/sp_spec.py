"""FLUX.2's sequence-parallel spec (diffusers 0.42's ``Flux2Transformer2DModel``): the image tokens are
the packed latents the model is given (``x_embedder`` projects them); the text joins them in joint
[text, image] attention (the double blocks' ``Flux2AttnProcessor`` with added projections; the single
blocks' fused ``Flux2ParallelSelfAttnProcessor`` on the concatenation); split with the tokens: ``img_ids``
[B, N, 4], before ``pos_embed`` builds the rotary table of cat(txt, img). The pipeline passes
batched ids, as the family's conditioning does.
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt

SP_SPEC = FamilySpec(
    family="flux2", cls_name="Flux2Transformer2DModel",
    splits=(SplitAt("", inputs={"hidden_states": Split(1, 3), "img_ids": Split(1, 3)}),),   # [B, N, C], [B, N, 4]
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("transformer_blocks.*.attn", "joint", ("Flux2AttnProcessor",), text="first"),
               AttentionSpec("single_transformer_blocks.*.attn", "joint", ("Flux2ParallelSelfAttnProcessor",),
                             text="first")),
    why_not_diffusers_cp="its _cp_plan shards the text too (text length must divide sp_size) and pads nothing",
)
