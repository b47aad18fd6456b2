"""The transformer configs of released checkpoints, for planning a config whose ``model.path`` (the
released pipeline's ``transformer/`` folder) is not on this machine: the planner needs only the
architecture's numbers, which are these (copied from each release's ``transformer/config.json``).

A path is recognised by one of its folder names (the repository's name, as ``huggingface-cli download``
or ``git clone`` writes it); the plan says that it used the released numbers.
"""

import os
from typing import Dict, Optional, Tuple

RELEASED: Dict[str, Tuple[str, dict]] = {
    # Wan-AI/Wan2.1-T2V-14B-Diffusers
    "Wan2.1-T2V-14B-Diffusers": ("WanTransformer3DModel", dict(
        patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024)),
    # black-forest-labs/FLUX.1-dev
    "FLUX.1-dev": ("FluxTransformer2DModel", dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=[16, 56, 56])),
    # hunyuanvideo-community/HunyuanVideo
    "HunyuanVideo": ("HunyuanVideoTransformer3DModel", dict(
        in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128, num_layers=20,
        num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1, qk_norm="rms_norm",
        guidance_embeds=True, text_embed_dim=4096, pooled_projection_dim=768, rope_theta=256.0,
        rope_axes_dim=[16, 56, 56])),
}


def released_config(path: Optional[str], class_name: str) -> Optional[Tuple[str, dict]]:
    """(release name, constructor arguments) of the release a missing ``model.path`` names, if any, for a
    model of class ``class_name``; None when ``path`` exists or names no known release."""
    if not path or os.path.exists(os.path.join(path, "config.json")):
        return None
    parts = {p.lower() for p in os.path.normpath(path).split(os.sep)}
    for name, (cls, config) in RELEASED.items():
        if name.lower() in parts and cls == class_name:
            return name, dict(config)
    return None
