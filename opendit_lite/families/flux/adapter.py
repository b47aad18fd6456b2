"""Flux's adapter: its forward inputs from a clip batch and its published training recipe:
flow matching, logit-normal training times, shift by token count (e^0.5 at 256 tokens
.. e^1.15 at 4096). Flux multiplies the time by 1000 itself and takes ``t``; its guidance embedding
(guidance-distilled checkpoints) is given ``GUIDANCE`` = 1 (scaled by 1000 inside), the value its LoRA
fine-tuning recipes train with.
"""

import torch

from ...diffusion.rectified_flow import resolution_shift
from ..adapter_base import FamilyAdapter, Recipe, pack_patches, unpack_patches

# The guidance embedding's value in training (guidance-distilled checkpoints).
GUIDANCE = 1.0


class FluxAdapter(FamilyAdapter):
    """Flux: an image model; 1-frame clips packed in 2x2 patches (Flux's ``in_channels`` is 4 x the
    latent channels), rotary ids (0, row, column) for the image tokens and zeros for the text,
    pooled text (CLIP's in the release), the guidance embedding for guidance-distilled (dev)
    configs; the time t in [0, 1]; no text mask (padding tokens are zero)."""

    class_name = "FluxTransformer2DModel"
    text_width_key = "joint_attention_dim"
    pooled_width_key = "pooled_projection_dim"
    image_only = True

    def recipe(self, config, tokens):
        return Recipe("rflow", "logit-normal", resolution_shift(tokens, 256, 4096, 0.5, 1.15))

    def patch_size(self, config):
        return 1, 2, 2

    def latent_channels(self, config):
        return int(config["in_channels"]) // 4

    def guidance_distilled(self, config):
        return bool(config.get("guidance_embeds"))

    def forward(self, model, config, x, t, states, mask, pooled):
        B, C, T, H, W = x.shape
        rows, cols = torch.meshgrid(torch.arange(H // 2, device=x.device), torch.arange(W // 2, device=x.device),
                                    indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3).to(x.dtype)  # [N, 3]
        txt_ids = torch.zeros(states.shape[1], 3, device=x.device, dtype=x.dtype)                       # [M, 3]
        guidance = torch.full_like(t, GUIDANCE) if config.get("guidance_embeds") else None
        out = model(hidden_states=pack_patches(x, 1, 2), timestep=t / 1000, guidance=guidance,
                    pooled_projections=pooled, encoder_hidden_states=states, txt_ids=txt_ids, img_ids=img_ids,
                    return_dict=False)[0]                                                             # [B, N, 4C]
        return unpack_patches(out, x.shape, 1, 2)                                                     # [B, C, 1, H, W]
