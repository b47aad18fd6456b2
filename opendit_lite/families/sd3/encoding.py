"""SD3's encoders: an image model; images through its 16-channel ``AutoencoderKL``, stored as 1-frame
latents (z - shift_factor) x scaling_factor; captions by T5 (the pipeline's third text encoder,
``text_encoder_3`` / ``tokenizer_3``), padded to 256 tokens. The release's two CLIPs' pooled vector is
derived from the caption states by the trainer instead.
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("SD3Transformer2DModel", "AutoencoderKL", "shift_scale", ("t5",), 256, image_only=True,
                          text_folders=("text_encoder_3", "tokenizer_3"))
