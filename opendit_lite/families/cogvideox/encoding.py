"""CogVideoX's encoders: latents of ``AutoencoderKLCogVideoX`` stored as z x scaling_factor; captions
by T5, padded to 226 tokens.
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("CogVideoXTransformer3DModel", "AutoencoderKLCogVideoX", "scale", ("t5",), 226)
