"""FLUX.2's encoders: an image model; images through its ``AutoencoderKLFlux2`` (the posterior mode),
stored as 1-frame latents of its 2x2 patches normalised by the VAE's own BatchNorm statistics
(``patch_batch_norm``: what ``Flux2Pipeline`` denoises, and the inverse of its step before decoding).
Captions: Mistral 3 (``mistral3``, the pipeline's ``text_encoder`` / ``tokenizer``), 512 tokens; the
transformer reads three of its hidden layers stacked through a chat template, which only the pipeline
computes, so captions are encoded from a pipeline folder (``model.pipeline``, ``extract_latents.py
--pipeline``).
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("Flux2Transformer2DModel", "AutoencoderKLFlux2", "patch_batch_norm", ("mistral3",), 512,
                          image_only=True, pixels_per_latent=16)                  # 8x VAE, then 2x2 patches
