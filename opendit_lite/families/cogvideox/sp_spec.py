"""CogVideoX's sequence-parallel spec (diffusers 0.42's ``CogVideoXTransformer3DModel``):
``patch_embed(text, latent)`` returns [text; image] and the model slices the image part; the text
joins the image tokens in joint [text, image] attention (the processor); split with the tokens:
``image_rotary_emb`` (cos, sin) [N, Dh] when passed.
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt

SP_SPEC = FamilySpec(
    family="cogvideox", cls_name="CogVideoXTransformer3DModel",
    splits=(
        # patch_embed returns [text; image]; the model slices the image part and feeds the blocks
        SplitAt("transformer_blocks.0", inputs={"hidden_states": Split(1, 3)}),    # [B, N, D]
        SplitAt("", inputs={"image_rotary_emb": (Split(0, 2), Split(0, 2))}),      # (cos, sin) [N, Dh]
    ),
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("transformer_blocks.*.attn1", "joint", ("CogVideoXAttnProcessor2_0",), text="first"),),
    why_not_diffusers_cp="no _cp_plan; its processor calls SDPA directly (a plan would leave attention local)",
)
