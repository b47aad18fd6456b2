"""Qwen-Image's sequence-parallel spec (diffusers 0.42's ``QwenImageTransformer2DModel``): the image
tokens are the packed latents (``hidden_states`` [B, N, 4C], then ``img_in``); the text joins them in
joint [text, image] attention (``QwenDoubleStreamAttnProcessor2_0``, the key mask over [text, image]
built from ``encoder_hidden_states_mask``); split with the tokens: the image half of ``pos_embed``'s
rotary table [N, Dh/2] (the text half, [M, Dh/2], stays whole).
"""

from typing import Optional

import torch.nn as nn

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt


def _unsupported(model: nn.Module) -> Optional[str]:
    if getattr(model.config, "zero_cond_t", False):
        return ("zero_cond_t=True (Qwen-Image-Edit-2511) modulates the reference tokens by a per-token index "
                "(modulate_index) built over the whole sequence, which a sequence shard does not split")
    return None


SP_SPEC = FamilySpec(
    family="qwen_image", cls_name="QwenImageTransformer2DModel",
    splits=(SplitAt("", inputs={"hidden_states": Split(1, 3)}),                     # packed latents [B, N, 4C]
            SplitAt("pos_embed", outputs={0: Split(0, 2)})),                        # image rotary table [N, Dh/2]
    gathers={"proj_out": Gather(1, 3)},
    attention=(AttentionSpec("transformer_blocks.*.attn", "joint", ("QwenDoubleStreamAttnProcessor2_0",),
                             text="first"),),
    unsupported=_unsupported,
    why_not_diffusers_cp="its _cp_plan shards the text and its mask too (text length must divide sp_size) and "
                         "pads nothing",
)
