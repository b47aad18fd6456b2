"""LTX-Video's sequence-parallel spec (diffusers 0.42's ``LTXVideoTransformer3DModel``): the image
tokens are made by ``proj_in`` on the packed latents; the text joins them in the cross-attention
(``attn2``) with a text mask; split with the tokens: the rope outputs (cos, sin) [B, N, D].
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt

SP_SPEC = FamilySpec(
    family="ltx_video", cls_name="LTXVideoTransformer3DModel",
    splits=(
        SplitAt("", inputs={"hidden_states": Split(1, 3)}),                        # packed latents [B, N, C]
        SplitAt("rope", outputs={0: Split(1, 3), 1: Split(1, 3)}),                 # (cos, sin) [B, N, D]
    ),
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("transformer_blocks.*.attn1", "self", ("LTXVideoAttnProcessor",)),
               AttentionSpec("transformer_blocks.*.attn2", "cross", ("LTXVideoAttnProcessor",))),
    why_not_diffusers_cp="its Ulysses backward crashes for cross-attention and its per-head text mask is not split",
)
