"""HunyuanVideo 1.5's encoders: latents of ``AutoencoderKLHunyuanVideo15`` stored as z x scaling_factor
(the pipeline divides by it before decoding); captions by Qwen2.5-VL's text model, 1000 tokens.

The VAE is given one clip at a time: diffusers 0.42.1's ``AutoencoderKLHunyuanVideo15.encode`` fails
on a batch of more than one clip (its causal attention mask is built for one). The pipeline's chat
template, hidden-layer choice and ByT5 glyph states are reproduced by a run from a pipeline folder
(``conditioning.py``), not by ``extract_latents.py``'s caption states.
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("HunyuanVideo15Transformer3DModel", "AutoencoderKLHunyuanVideo15", "scale",
                          ("qwen2_5_vl_text",), 1000, one_clip_at_a_time=True,
                          pixels_per_latent=16)                                    # the VAE's 16x spatial compression
