"""Qwen-Image's encoders: an image model; images through ``AutoencoderKLQwenImage`` (a causal 3D VAE:
images go in as 1-frame clips), stored as 1-frame latents (z - mean) / std with the VAE config's
per-channel ``latents_mean`` / ``latents_std``. Captions are encoded only as the pipeline encodes them
(``conditioning.py``: Qwen2.5-VL's last hidden state of the caption in the prompt template, the
template's system prefix dropped, up to 512 tokens): its ``qwen2_5_vl`` has no generic encoder class,
so ``extract_latents.py --family`` refuses a separate text-encoder folder and points to ``--pipeline``.
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("QwenImageTransformer2DModel", "AutoencoderKLQwenImage", "mean_std", ("qwen2_5_vl",), 512,
                          image_only=True, video_vae=True)
