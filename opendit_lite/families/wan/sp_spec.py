"""Wan's sequence-parallel spec (diffusers 0.42's ``WanTransformer3DModel``): the image tokens are
made by ``patch_embedding`` (a Conv3d); the text joins them only in the cross-attention (``attn2``);
split with the tokens: the rope outputs [1, N, 1, Dh] and Wan 2.2's per-token timestep [B, N].
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt

SP_SPEC = FamilySpec(
    family="wan", cls_name="WanTransformer3DModel",
    splits=(
        SplitAt("rope", outputs={0: Split(1, 4), 1: Split(1, 4)}),                 # (cos, sin) [1, N, 1, Dh]
        SplitAt("blocks.0", inputs={"hidden_states": Split(1, 3)}),                # [B, N, D]
        SplitAt("", inputs={"timestep": Split(1, 2, optional=True)}),               # Wan 2.2 TI2V: [B, N]
    ),
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("blocks.*.attn1", "self", ("WanAttnProcessor",)),
               AttentionSpec("blocks.*.attn2", "cross", ("WanAttnProcessor",))),
    why_not_diffusers_cp="its _cp_plan has no padding: token counts must divide sp_size",
)
