"""HunyuanVideo's encoders: latents of ``AutoencoderKLHunyuanVideo`` stored as z x scaling_factor;
captions by Llama's last hidden states, padded to 256 tokens. The release's second encoder (CLIP's
pooled vector, which the trainer derives from the caption states instead), its prompt template and
its hidden-layer choice are not reproduced.
"""

from ...encoders.family_encoders import FamilyEncoders

ENCODING = FamilyEncoders("HunyuanVideoTransformer3DModel", "AutoencoderKLHunyuanVideo", "scale", ("llama",), 256)
