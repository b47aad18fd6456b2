"""LTX-Video's encoders: latents of ``AutoencoderKLLTXVideo`` stored as (z - mean) x scaling_factor / std
(the VAE model's ``latents_mean`` / ``latents_std`` buffers); captions by T5, padded to 128 tokens.
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("LTXVideoTransformer3DModel", "AutoencoderKLLTXVideo", "mean_std_scale", ("t5",), 128)
