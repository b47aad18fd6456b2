"""HunyuanVideo 1.5's sequence-parallel spec (diffusers 0.42's ``HunyuanVideo15Transformer3DModel``): the
image tokens are made by ``x_embedder`` (a Conv3d patch embedding); the text stream (caption, ByT5 glyph
and image tokens, valid ones first) joins them in joint [image, text] attention (added projections);
split with the tokens: the rope outputs (cos, sin) [N, Dh]. The token refiner's attention is over the
caption only and runs as it is.

``HunyuanVideo15AttnProcessor2_0`` masks its joint attention by query as well as by key
(``valid[i] & valid[j]``: a masked text token attends to nothing); declared ``query_mask``, the
sequence-parallel attention runs it with the key mask: only the masked text tokens' rows change, and
those tokens are attended by nothing after (and dropped after the last block), so no output and no
gradient changes.
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt

SP_SPEC = FamilySpec(
    family="hunyuan_video15", cls_name="HunyuanVideo15Transformer3DModel",
    splits=(
        SplitAt("rope", outputs={0: Split(0, 2), 1: Split(0, 2)}),                 # (cos, sin) [N, Dh]
        SplitAt("x_embedder", outputs={0: Split(1, 3)}),                           # [B, N, D]
    ),
    gathers={"proj_out": Gather(1, 3)},
    attention=(
        AttentionSpec("transformer_blocks.*.attn", "joint", ("HunyuanVideo15AttnProcessor2_0",), text="last",
                      query_mask=True),
        AttentionSpec("context_embedder.token_refiner.refiner_blocks.*.attn", "serial", ("AttnProcessor2_0",)),
    ),
    why_not_diffusers_cp="no _cp_plan in diffusers 0.42; a diffusers-style plan collects the replicated text P times",
)
