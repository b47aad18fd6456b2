"""Z-Image's sequence-parallel spec (diffusers 0.42's ``ZImageTransformer2DModel``).

Its forward builds the token sequences itself from per-sample lists: each sample's patches and its
caption padded to a multiple of 32 tokens, embedded, refined apart (``noise_refiner`` over the image
tokens, ``context_refiner`` over the caption's), then joined per sample as [image, caption] into one
sequence with its rotary table and, when the samples' lengths differ, a key mask. The refiners (2 + 2
of the release's 34 blocks) run whole on every rank ("serial"); the joint sequence is split where the
main ``layers`` receive it: the tokens at the first layer, the mask and the rotary table at every
layer (the forward hands each layer the whole ones), and the layers' attention is self-attention over
the shards (the caption tokens are sharded with the image's). The final layer's output is gathered
before the model unpatchifies it.
"""

from ...parallel.diffusers_sp.spec_types import AttentionSpec, FamilySpec, Gather, Split, SplitAt

PROCESSOR = ("ZSingleStreamAttnProcessor",)

SP_SPEC = FamilySpec(
    family="z_image", cls_name="ZImageTransformer2DModel",
    splits=(SplitAt("layers.0", inputs={"x": Split(1, 3)}),                                  # [B, S, D]
            SplitAt("layers.*", inputs={"attn_mask": Split(1, 2),                            # [B, S] bool
                                        "freqs_cis": Split(1, 3)})),                         # [B, S, Dh/2] complex
    gathers={"all_final_layer.*": Gather(1, 3)},                                             # [B, S, p p C]
    attention=(AttentionSpec("noise_refiner.*.attention", "serial", PROCESSOR),
               AttentionSpec("context_refiner.*.attention", "serial", PROCESSOR),
               AttentionSpec("layers.*.attention", "self", PROCESSOR)),
    unsupported=lambda model: ("the Omni layout (siglip_feat_dim) joins several images per sample"
                               if model.config.get("siglip_feat_dim") is not None else None),
    why_not_diffusers_cp="no _cp_plan; its sequences are built from per-sample lists inside forward",
)
