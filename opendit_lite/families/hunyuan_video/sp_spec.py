"""HunyuanVideo's sequence-parallel spec (diffusers 0.42's ``HunyuanVideoTransformer3DModel``): the
image tokens are made by ``x_embedder`` (a Conv3d); the text joins them in joint [image, text]
attention (double blocks: added projections; single blocks concatenate), with the key mask over
[image, text] from ``encoder_attention_mask``; split with the tokens: the rope outputs (cos, sin)
[N, Dh]. The token refiner's attention is over the text only and runs as it is.
"""

from typing import Optional

import torch.nn as nn

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt


def _unsupported(model: nn.Module) -> Optional[str]:
    if getattr(model.config, "image_condition_type", None) == "token_replace":
        return ("image_condition_type='token_replace' modulates the first frame's tokens differently "
                "(first_frame_num_tokens), which a sequence shard cannot tell apart")
    return None


SP_SPEC = FamilySpec(
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
    unsupported=_unsupported,
    why_not_diffusers_cp="no _cp_plan; a diffusers-style plan collects the replicated text P times (wrong gradients)",
)
