"""Flux's encoders: an image model; images through its 16-channel ``AutoencoderKL``, stored as 1-frame
latents (z - shift_factor) x scaling_factor; captions by T5 (the pipeline's second text encoder,
``text_encoder_2`` / ``tokenizer_2``), padded to 512 tokens. The release's CLIP pooled vector is
derived from the caption states by the trainer instead.
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("FluxTransformer2DModel", "AutoencoderKL", "shift_scale", ("t5",), 512, image_only=True,
                          text_folders=("text_encoder_2", "tokenizer_2"))
