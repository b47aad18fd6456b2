"""HunyuanVideo 1.5's sequence-parallel spec (diffusers 0.42's ``HunyuanVideo15Transformer3DModel``): the
image tokens are made by ``x_embedder`` (a Conv3d patch embedding); the text stream (caption, ByT5 glyph
and image tokens, valid ones first) joins them in joint [image, text] attention (added projections);
split with the tokens: the rope outputs (cos, sin) [N, Dh]. The token refiner's attention is over the
caption only and runs as it is.

Not run yet: ``HunyuanVideo15AttnProcessor2_0`` masks its joint attention by query as well as by key
(``mask[i, j] = valid[i] & valid[j]``, so a masked text token attends to nothing), which the sequence-
parallel attention core refuses (it shards key masks only). The image tokens' outputs depend on the
key mask alone, so a key-mask reduction would run it; until that is written and tested, ``unsupported``
says so and ``sp_size > 1`` is refused by name.
"""

from typing import Optional

import torch.nn as nn

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt


def _unsupported(model: nn.Module) -> Optional[str]:
    return ("its joint attention masks queries as well as keys (HunyuanVideo15AttnProcessor2_0 builds an "
            "[L, L] mask), and the sequence-parallel attention shards key masks only: train it with sp_size=1")


SP_SPEC = FamilySpec(
    family="hunyuan_video15", cls_name="HunyuanVideo15Transformer3DModel",
    splits=(
        SplitAt("rope", outputs={0: Split(0, 2), 1: Split(0, 2)}),                 # (cos, sin) [N, Dh]
        SplitAt("x_embedder", outputs={0: Split(1, 3)}),                           # [B, N, D]
    ),
    gathers={"proj_out": Gather(1, 3)},
    attention=(
        AttentionSpec("transformer_blocks.*.attn", "joint", ("HunyuanVideo15AttnProcessor2_0",), text="last"),
        AttentionSpec("context_embedder.token_refiner.refiner_blocks.*.attn", "serial", ("AttnProcessor2_0",)),
    ),
    unsupported=_unsupported,
    why_not_diffusers_cp="no _cp_plan in diffusers 0.42; a diffusers-style plan collects the replicated text P times",
)
