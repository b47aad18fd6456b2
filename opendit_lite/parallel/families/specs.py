"""The sequence-parallel specs of the six diffusers families (diffusers 0.42's classes).

Only image/video tokens are sharded; text tokens stay whole on every rank (so text lengths need not
divide the SP size, and text refiners run as they are). Per family, where the image tokens are made,
where the text joins them, and what else is indexed by the image tokens:

============  ===========================  =============================================  =========================
family        image tokens made by         text joins image tokens                        split with the tokens
============  ===========================  =============================================  =========================
Wan           patch_embedding (Conv3d)     cross-attention (attn2) only                   rope outputs [1, N, 1, Dh];
                                                                                          Wan 2.2's per-token
                                                                                          timestep [B, N]
Flux          x_embedder on packed         joint [text, image] in the double blocks'      img_ids [N, 3] (before
              latents                      processor; single blocks concatenate first     pos_embed builds the rotary
                                                                                          table of cat(txt, img))
CogVideoX     patch_embed(text, latent)    joint [text, image] in the processor           image_rotary_emb (cos, sin)
              returns [text; image]                                                       [N, Dh] when passed
HunyuanVideo  x_embedder (Conv3d)          joint [image, text] (double blocks: added      rope outputs (cos, sin)
                                           projections; single blocks concatenate); the   [N, Dh]
                                           key mask over [image, text] from
                                           encoder_attention_mask
LTX-Video     proj_in on packed latents    cross-attention (attn2) with a text mask       rope outputs (cos, sin)
                                                                                          [B, N, D]
SD3 / SD3.5   pos_embed (patches + abs.    joint [image, text] (JointAttnProcessor2_0);   (positions added in
              positions)                   SD3.5's attn2: image-only self-attention       pos_embed, before the split)
============  ===========================  =============================================  =========================

Why not diffusers' own context parallelism (``enable_parallelism`` + ``ContextParallelConfig``, driven
around its accelerator-only set-up on CPU gloo, fp32): it pads nothing (uneven token counts fail its
equipartition assertion; its "anything" mode needs an accelerator), its plans shard the text too for
Flux and LTX (text length must divide the SP size), LTX's Ulysses backward reshapes key/value
gradients with the query length (crashes for cross-attention) and its per-head text mask is not split
with the heads, a diffusers-style plan is silently wrong for HunyuanVideo (the all-to-all of [image,
text] collects the text P times: gradient error 0.57) and for SD3/CogVideoX (their processors call
SDPA directly, so attention stays local: 0.54), its ring backward is wrong at ring degree 4 (see
``parallel/ring.py``), and its gather's backward makes the SP-group *sum* the serial gradient where the
package's data-parallel mean needs the SP-group *mean*. Where it works (Wan and Flux at token and text
counts divisible by P) it matches; our path covers all six with padding, masks, ring and USP.
"""

from typing import Optional

import torch.nn as nn

from .spec import AttentionSpec, FamilySpec, Gather, Split, SplitAt


def _hunyuan_unsupported(model: nn.Module) -> Optional[str]:
    if getattr(model.config, "image_condition_type", None) == "token_replace":
        return ("image_condition_type='token_replace' modulates the first frame's tokens differently "
                "(first_frame_num_tokens), which a sequence shard cannot tell apart")
    return None


WAN = FamilySpec(
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

FLUX = FamilySpec(
    family="flux", cls_name="FluxTransformer2DModel",
    splits=(SplitAt("", inputs={"hidden_states": Split(1, 3), "img_ids": Split(0, 2)}),),   # [B, N, C], [N, 3]
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("transformer_blocks.*.attn", "joint", ("FluxAttnProcessor",), text="first"),
               AttentionSpec("single_transformer_blocks.*.attn", "joint", ("FluxAttnProcessor",), text="first")),
    why_not_diffusers_cp="its _cp_plan shards the text too (text length must divide sp_size) and pads nothing",
)

COGVIDEOX = FamilySpec(
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

HUNYUAN_VIDEO = FamilySpec(
    family="hunyuan_video", cls_name="HunyuanVideoTransformer3DModel",
    splits=(
        SplitAt("rope", outputs={0: Split(0, 2), 1: Split(0, 2)}),                 # (cos, sin) [N, Dh]
        # after patch embedding: the key mask is then built over [local image, text]
        SplitAt("x_embedder", outputs={0: Split(1, 3)}),                           # [B, N, D]
    ),
    gathers={"proj_out": Gather(1, 3)},
    attention=(
        AttentionSpec("transformer_blocks.*.attn", "joint", ("HunyuanVideoAttnProcessor2_0",), text="last"),
        AttentionSpec("single_transformer_blocks.*.attn", "joint", ("HunyuanVideoAttnProcessor2_0",), text="last"),
        AttentionSpec("context_embedder.token_refiner.refiner_blocks.*.attn", "serial", ("AttnProcessor2_0",)),
    ),
    unsupported=_hunyuan_unsupported,
    why_not_diffusers_cp="no _cp_plan; a diffusers-style plan collects the replicated text P times (wrong gradients)",
)

LTX_VIDEO = FamilySpec(
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

SD3 = FamilySpec(
    family="sd3", cls_name="SD3Transformer2DModel",
    splits=(SplitAt("pos_embed", outputs={0: Split(1, 3)}),),                      # patches + positions [B, N, D]
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("transformer_blocks.*.attn", "joint", ("JointAttnProcessor2_0",), text="last"),
               AttentionSpec("transformer_blocks.*.attn2", "self", ("JointAttnProcessor2_0",))),  # SD3.5 dual
    why_not_diffusers_cp="no _cp_plan; its processor calls SDPA directly (a plan would leave attention local)",
)

FAMILY_SPECS = (WAN, FLUX, COGVIDEOX, HUNYUAN_VIDEO, LTX_VIDEO, SD3)
