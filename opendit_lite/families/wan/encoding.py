"""Wan's encoders: latents of ``AutoencoderKLWan`` stored as (z - mean) / std (the VAE config's
per-channel ``latents_mean`` / ``latents_std``); captions by UMT5 (a T5), padded to 512 tokens.
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("WanTransformer3DModel", "AutoencoderKLWan", "mean_std", ("umt5", "t5"), 512)
