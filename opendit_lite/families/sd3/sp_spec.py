"""SD3 / SD3.5's sequence-parallel spec (diffusers 0.42's ``SD3Transformer2DModel``): the image tokens
are made by ``pos_embed`` (patches + absolute positions, added before the split); the text joins them
in joint [image, text] attention (``JointAttnProcessor2_0``); SD3.5's ``attn2`` is image-only
self-attention.
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt

SP_SPEC = FamilySpec(
    family="sd3", cls_name="SD3Transformer2DModel",
    splits=(SplitAt("pos_embed", outputs={0: Split(1, 3)}),),                      # patches + positions [B, N, D]
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("transformer_blocks.*.attn", "joint", ("JointAttnProcessor2_0",), text="last"),
               AttentionSpec("transformer_blocks.*.attn2", "self", ("JointAttnProcessor2_0",))),  # SD3.5 dual
    why_not_diffusers_cp="no _cp_plan; its processor calls SDPA directly (a plan would leave attention local)",
)
