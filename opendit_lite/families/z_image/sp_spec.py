"""Z-Image's sequence-parallel spec (diffusers 0.42's ``ZImageTransformer2DModel``): declared, and
refused for now (``unsupported``), with the reason.

Its forward builds the token sequences itself from per-sample lists: each sample's patches and caption
are padded to a multiple of 32 tokens (with pad tokens and a bool attention mask when lengths
differ), embedded as one concatenation, refined separately (``noise_refiner``: image tokens,
``context_refiner``: caption tokens), then joined per sample as [image, caption] for the main
``layers`` and unpatchified from the list. There is no module whose output is the batch's image
tokens as one [B, N, D] tensor to shard before the first attention, and the joint sequence is
rebuilt in Python between the refiners and the main layers, so the split/gather points this
mechanism places at module boundaries do not exist. The attention modules it would cover are listed
(the refiners' self-attention, the main layers' joint attention with the text last).
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec

_WHY = ("ZImageTransformer2DModel builds its token sequences from per-sample lists inside forward (each sample "
        "padded to 32-token multiples, refined apart, joined as [image, caption] in Python), so there is no module "
        "output holding the batch's image tokens to split; sequence parallelism is not supported for Z-Image yet")

SP_SPEC = FamilySpec(
    family="z_image", cls_name="ZImageTransformer2DModel",
    splits=(),
    gathers={},
    attention=(AttentionSpec("noise_refiner.*.attention", "self", ("ZSingleStreamAttnProcessor",)),
               AttentionSpec("context_refiner.*.attention", "serial", ("ZSingleStreamAttnProcessor",)),
               AttentionSpec("layers.*.attention", "joint", ("ZSingleStreamAttnProcessor",), text="last")),
    supported_sp_modes=(),
    unsupported=lambda model: _WHY,
    why_not_diffusers_cp="no _cp_plan; its sequences are built from per-sample lists inside forward",
)
