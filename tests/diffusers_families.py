"""Tiny diffusers transformers of the registered families (the six trained first and Qwen-Image, Z-Image,
FLUX.2 and HunyuanVideo 1.5), and forward inputs for each.

The sizes are those of diffusers' own model tests (2 heads, widths 16-24, 1-2 layers); each family
has 2 repeated blocks, so that selective checkpointing has one to checkpoint and one to leave. The
variants exercise the other code paths of a family's blocks: SD3.5's dual attention
(``SD35AdaLayerNormZeroX``), CogVideoX 1.5 (rotary embedding, temporal patches, ``ofs``) and
Wan 2.2's per-token timesteps (per-token modulation).

Every builder perturbs all weights (diffusers zero-initialises some output layers) so that every
parameter gets a non-trivial gradient. ``forward_inputs(name)`` gives the keyword arguments of
the model's forward; ``output(model, inputs)`` runs it and returns the prediction tensor.
"""

from typing import Dict

import torch
import torch.nn as nn

import opendit_lite.families  # noqa: F401  (registers the families with the mechanisms the tests call directly)

FAMILIES = (
    "WanTransformer3DModel",
    "FluxTransformer2DModel",
    "SD3Transformer2DModel",
    "CogVideoXTransformer3DModel",
    "HunyuanVideoTransformer3DModel",
    "LTXVideoTransformer3DModel",
    "QwenImageTransformer2DModel",
    "ZImageTransformer2DModel",
    "Flux2Transformer2DModel",
    "HunyuanVideo15Transformer3DModel",
)
# Registered families these shared tests leave out, and where each is tested instead.
TESTED_APART: Dict[str, str] = {}

CONFIGS: Dict[str, dict] = {
    "WanTransformer3DModel": dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32),
    "FluxTransformer2DModel": dict(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=[2, 2, 4]),
    "SD3Transformer2DModel": dict(
        sample_size=32, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        caption_projection_dim=16, joint_attention_dim=32, pooled_projection_dim=32, out_channels=4,
        pos_embed_max_size=32, dual_attention_layers=(), qk_norm="rms_norm"),
    "CogVideoXTransformer3DModel": dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
        text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=9, patch_size=2,
        patch_size_t=None, temporal_compression_ratio=4, max_text_seq_length=8),
    "HunyuanVideoTransformer3DModel": dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=16, pooled_projection_dim=16, rope_axes_dim=(2, 4, 4)),
    "LTXVideoTransformer3DModel": dict(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        num_layers=2, qk_norm="rms_norm_across_heads", caption_channels=32),
    # 12 heads: its rotary table (complex64, one per sequence, not per sample) stays a small share of the
    # saved activations, as at the release's widths (the planner scales every per-token tensor by the batch).
    "QwenImageTransformer2DModel": dict(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=12,
        joint_attention_dim=32, axes_dims_rope=(2, 2, 4)),
    # Z-Image without its refiners (n_refiner_layers 0), so that its two blocks are the main layers'; the
    # refiners run in the tiny pipeline's tests (tests/families/test_z_image_conditioning.py and others).
    "ZImageTransformer2DModel": dict(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=2, n_refiner_layers=0,
        n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6], axes_lens=[64, 16, 16]),
    "Flux2Transformer2DModel": dict(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=24, timestep_guidance_channels=16, axes_dims_rope=(2, 2, 2, 2), guidance_embeds=True),
    # 4 latent channels, the 9 inputs being latents, condition latents and their mask; ByT5 (glyph) states 8
    # wide, image (SigLIP) states 8 wide.
    "HunyuanVideo15Transformer3DModel": dict(
        in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=32, text_embed_2_dim=8,
        image_embed_dim=8, rope_axes_dim=(2, 2, 4)),
}

# name -> (family, overrides)
VARIANTS: Dict[str, tuple] = {
    "SD3.5-dual-attention": ("SD3Transformer2DModel", dict(dual_attention_layers=(0,))),
    # CogVideoX 1.5: 3-D RoPE (head dim split 1/4 : 3/8 : 3/8, so 16), temporal patches, ofs embedding.
    "CogVideoX1.5": ("CogVideoXTransformer3DModel", dict(patch_size_t=2, attention_head_dim=16,
                                                         use_rotary_positional_embeddings=True, ofs_embed_dim=2)),
    "Wan2.2-per-token": ("WanTransformer3DModel", {}),
}

TEXT_TOKENS = 6
# Latent sizes [C, T, H, W] (images [C, H, W]): small, with token counts that are not powers of two.
FRAMES, HEIGHT, WIDTH = 3, 4, 6


def family_of(name: str) -> str:
    return VARIANTS[name][0] if name in VARIANTS else name


def perturb(model: nn.Module, seed: int = 0, scale: float = 0.05) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def build(name: str, seed: int = 0, **overrides) -> nn.Module:
    """The tiny model ``name`` (a family or a variant), weights seeded and perturbed, in train mode."""
    import diffusers

    family = family_of(name)
    config = dict(CONFIGS[family], **(VARIANTS[name][1] if name in VARIANTS else {}), **overrides)
    torch.manual_seed(seed)
    return perturb(getattr(diffusers, family)(**config), seed).train()


def forward_inputs(name: str, batch: int = 2, seed: int = 1) -> dict:
    """Keyword arguments of the model's forward for a batch of ``batch`` samples."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    family = family_of(name)
    config = dict(CONFIGS[family], **(VARIANTS[name][1] if name in VARIANTS else {}))
    times = torch.rand(batch, generator=g)                                     # [B] in [0, 1)
    mask = torch.arange(TEXT_TOKENS)[None] < torch.tensor([TEXT_TOKENS, TEXT_TOKENS - 2] * batch)[:batch, None]
    if family == "WanTransformer3DModel":
        timestep = times * 1000
        if name == "Wan2.2-per-token":  # one timestep per latent token (after patching)
            tokens = FRAMES * (HEIGHT // 2) * (WIDTH // 2)
            timestep = torch.rand(batch, tokens, generator=g) * 1000           # [B, N]
        return dict(hidden_states=randn(batch, 4, FRAMES, HEIGHT, WIDTH), timestep=timestep,
                    encoder_hidden_states=randn(batch, TEXT_TOKENS, config["text_dim"]), return_dict=False)
    if family == "FluxTransformer2DModel":
        h, w = HEIGHT // 2, WIDTH // 2                                         # 2x2-packed latent grid
        grid = torch.meshgrid(torch.zeros(1), torch.arange(float(h)), torch.arange(float(w)), indexing="ij")
        img_ids = torch.stack(grid, dim=-1).reshape(-1, 3)                     # [N, 3]: (0, row, column)
        return dict(hidden_states=randn(batch, h * w, config["in_channels"]), timestep=times,
                    guidance=torch.full((batch,), 3.5), pooled_projections=randn(batch, 16),
                    encoder_hidden_states=randn(batch, TEXT_TOKENS, 32), txt_ids=torch.zeros(TEXT_TOKENS, 3),
                    img_ids=img_ids, return_dict=False)
    if family == "SD3Transformer2DModel":
        return dict(hidden_states=randn(batch, 4, HEIGHT * 2, WIDTH), timestep=times * 1000,
                    encoder_hidden_states=randn(batch, TEXT_TOKENS, 32), pooled_projections=randn(batch, 32),
                    return_dict=False)
    if family == "CogVideoXTransformer3DModel":
        frames, height, width = (2, 8, 6) if name == "CogVideoX1.5" else (FRAMES, 8, WIDTH)
        inputs = dict(hidden_states=randn(batch, frames, 4, height, width), timestep=(times * 1000).long(),
                      encoder_hidden_states=randn(batch, config["max_text_seq_length"], 32), return_dict=False)
        if name == "CogVideoX1.5":
            inputs.update(ofs=torch.full((batch,), 2.0), image_rotary_emb=_cogvideox_rope(frames, height, width))
        return inputs
    if family == "HunyuanVideoTransformer3DModel":
        return dict(hidden_states=randn(batch, 4, FRAMES, HEIGHT, WIDTH), timestep=times * 1000,
                    encoder_hidden_states=randn(batch, TEXT_TOKENS, 16), encoder_attention_mask=mask,
                    pooled_projections=randn(batch, 16), guidance=torch.full((batch,), 1000.0), return_dict=False)
    if family == "LTXVideoTransformer3DModel":
        return dict(hidden_states=randn(batch, FRAMES * HEIGHT * WIDTH, 8), timestep=times * 1000,
                    encoder_hidden_states=randn(batch, TEXT_TOKENS, 32), encoder_attention_mask=mask.long(),
                    num_frames=FRAMES, height=HEIGHT, width=WIDTH, return_dict=False)
    if family == "QwenImageTransformer2DModel":
        h, w = HEIGHT // 2, WIDTH // 2                                         # 2x2-packed latent grid
        return dict(hidden_states=randn(batch, h * w, config["in_channels"]), timestep=times,
                    encoder_hidden_states=randn(batch, TEXT_TOKENS, 32), encoder_hidden_states_mask=mask,
                    img_shapes=[[(1, h, w)]] * batch, return_dict=False)
    if family == "ZImageTransformer2DModel":  # per-sample lists: latents [C, 1, H, W], captions [L_i, W]
        return dict(x=[randn(4, 1, HEIGHT, WIDTH) for _ in range(batch)], t=times,
                    cap_feats=[randn(int(m.sum()), 16) for m in mask], return_dict=False)
    if family == "Flux2Transformer2DModel":
        h, w = HEIGHT, WIDTH                                                   # one token per latent pixel
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        zeros = torch.zeros_like(rows)
        img_ids = torch.stack([zeros, rows, cols, zeros], dim=-1).reshape(1, -1, 4)   # [1, N, 4]: (0, row, column, 0)
        txt_ids = torch.stack([torch.zeros(TEXT_TOKENS, dtype=torch.long)] * 3 + [torch.arange(TEXT_TOKENS)], -1)
        return dict(hidden_states=randn(batch, h * w, config["in_channels"]), timestep=times,
                    guidance=torch.full((batch,), 4.0), encoder_hidden_states=randn(batch, TEXT_TOKENS, 24),
                    txt_ids=txt_ids[None].expand(batch, -1, -1), img_ids=img_ids.expand(batch, -1, -1),
                    return_dict=False)
    if family == "HunyuanVideo15Transformer3DModel":  # caption, glyph text (sample 0: 2 of 3 valid, 1: none), image
        mask_2 = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]] * batch)[:batch]
        return dict(hidden_states=randn(batch, 9, FRAMES, HEIGHT, WIDTH), timestep=times * 1000,
                    encoder_hidden_states=randn(batch, TEXT_TOKENS, 32), encoder_attention_mask=mask.float(),
                    encoder_hidden_states_2=randn(batch, 3, 8), encoder_attention_mask_2=mask_2,
                    image_embeds=randn(batch, 2, 8), return_dict=False)
    raise KeyError(name)


def _cogvideox_rope(frames: int, height: int, width: int):
    """(cos, sin) of CogVideoX 1.5's 3-D rotary embedding for a latent of that size (patch 2, p_t 2)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    return get_3d_rotary_pos_embed(embed_dim=16, crops_coords=None, grid_size=(height // 2, width // 2),
                                   temporal_size=frames // 2, grid_type="slice", max_size=(height // 2, width // 2))


def output(model: nn.Module, inputs: dict) -> torch.Tensor:
    """The model's prediction for ``inputs`` (the first element of its return tuple; a list of
    per-sample predictions, Z-Image's, stacked)."""
    out = model(**inputs)[0]
    return torch.stack(out) if isinstance(out, list) else out


def loss(model: nn.Module, inputs: dict, target: torch.Tensor = None) -> torch.Tensor:
    """Mean squared prediction (or error against ``target``) in fp32: a loss every parameter feeds."""
    out = output(model, inputs).float()
    return ((out - target) ** 2).mean() if target is not None else (out ** 2).mean()


# Inputs shared by every sample (position ids, a rotary table): not split with the batch.
SHARED_INPUTS = ("img_ids", "txt_ids", "image_rotary_emb")


def batch_slice(inputs: dict, start: int, stop: int) -> dict:
    """Samples ``start:stop`` of ``forward_inputs``: a data-parallel rank's share of the batch."""
    return {k: v[start:stop] if isinstance(v, (torch.Tensor, list)) and k not in SHARED_INPUTS else v
            for k, v in inputs.items()}


def randomize_adapters(model: nn.Module, seed: int = 2, scale: float = 0.1) -> nn.Module:
    """Give every LoRA B matrix random values (peft starts them at zero, so A would get no
    gradient), the same for every model of the same structure."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model
