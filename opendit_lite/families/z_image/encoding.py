"""Z-Image's encoders: an image model; images through Flux's 16-channel ``AutoencoderKL``, stored as
1-frame latents (z - shift_factor) x scaling_factor (``ZImagePipeline`` decodes z / scaling_factor +
shift_factor); captions by its Qwen3 text encoder (``text_encoder`` / ``tokenizer``), 512 tokens.

The pipeline encodes the caption in Qwen3's chat template and reads the second-to-last hidden state,
which the generic ``--family`` text encoder (last hidden state, no template) does not reproduce, so
``--family z_image`` refuses its text encoder (``load_family_text_encoder``: no generic class for
``qwen3``): extract Z-Image latents with ``scripts/extract_latents.py --pipeline`` (its own
``encode_prompt``).
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("ZImageTransformer2DModel", "AutoencoderKL", "shift_scale", ("qwen3",), 512,
                          image_only=True)
