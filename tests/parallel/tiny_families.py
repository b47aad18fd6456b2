"""Tiny random-initialised models of the seven diffusers families (sizes of diffusers' own model tests: 2
heads, widths 16-32, 1-2 layers) and their forward inputs, for the sequence-parallel tests: token
counts that do not divide the group and masked text streams (``tests/diffusers_families.py`` holds
the kernel, checkpointing, LoRA and plugin tests' models, with perturbed weights and variants).

``variant``: "even" (32 image tokens; Flux 16) or "uneven" (15 tokens: odd at sp 2, not a multiple of 4
at sp 4). Text streams: Flux 7 text tokens (odd: text is never split), HunyuanVideo 12 with sample 0
masking 3 (its key mask over [image, text]), HunyuanVideo 1.5 12 caption tokens (sample 0 masking 3),
5 glyph tokens (sample 0 masking 2, sample 1 all) and 3 image tokens (its query and key mask),
Qwen-Image 9 with sample 0 masking 3 (its key mask over [text, image]), LTX-Video 16
with sample 0 masking 5 (a cross-attention mask); the masks change the serial output by
about 1e-2, so they are really exercised.
Flux also takes "kontext": FLUX.1 Kontext's layout, the "uneven" target's 15 tokens then a 2 x 3
reference's 6 whose ids have first coordinate 1 (21 in all).
"""

import torch

import opendit_lite.families  # noqa: F401  (registers the families' sequence-parallel specs)

WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
           text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
           qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
FLUX = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8),
            guidance_embeds=True)
COGVIDEOX = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
                 text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8, sample_frames=8, patch_size=2,
                 temporal_compression_ratio=4, max_text_seq_length=8)
HUNYUAN_VIDEO = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
                     num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
                     text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None)
HUNYUAN_VIDEO15 = dict(in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                       num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=16, text_embed_2_dim=8,
                       image_embed_dim=8, rope_axes_dim=(2, 2, 4))
LTX_VIDEO = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
                 num_layers=1, qk_norm="rms_norm_across_heads", caption_channels=16)
SD3 = dict(sample_size=32, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
           caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4,
           pos_embed_max_size=96, dual_attention_layers=(0,), qk_norm="rms_norm")   # SD3.5: dual attention, qk norm
QWEN_IMAGE = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                  num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(4, 6, 6))
Z_IMAGE = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=1, n_refiner_layers=1,
               n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6], axes_lens=[256, 32, 32])
FLUX2 = dict(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, timestep_guidance_channels=16, axes_dims_rope=(4, 4, 4, 4),
             guidance_embeds=True)

CONFIGS = {"wan": ("WanTransformer3DModel", WAN), "flux": ("FluxTransformer2DModel", FLUX),
           "cogvideox": ("CogVideoXTransformer3DModel", COGVIDEOX),
           "hunyuan_video": ("HunyuanVideoTransformer3DModel", HUNYUAN_VIDEO),
           "hunyuan_video15": ("HunyuanVideo15Transformer3DModel", HUNYUAN_VIDEO15),
           "ltx_video": ("LTXVideoTransformer3DModel", LTX_VIDEO), "sd3": ("SD3Transformer2DModel", SD3),
           "qwen_image": ("QwenImageTransformer2DModel", QWEN_IMAGE),
           "z_image": ("ZImageTransformer2DModel", Z_IMAGE),
           "flux2": ("Flux2Transformer2DModel", FLUX2)}
# Families whose forward takes and returns per-sample lists, checked in a test of their own
# (tests/parallel/test_z_image_sp.py) rather than by the shared cases below.
OWN_TESTS = ("z_image",)
FAMILIES = [f for f in CONFIGS if f not in OWN_TESTS]

# (F, H, W) latent grids per variant: tokens = F * H/p * W/p
_GRIDS = {"wan": {"even": (2, 8, 8), "uneven": (1, 6, 10)}, "flux": {"even": (4, 4), "uneven": (3, 5)},
          "cogvideox": {"even": (2, 8, 8), "uneven": (1, 6, 10)},
          "hunyuan_video": {"even": (2, 4, 4), "uneven": (1, 3, 5)},
          "hunyuan_video15": {"even": (2, 4, 4), "uneven": (1, 3, 5)},
          "ltx_video": {"even": (2, 4, 4), "uneven": (1, 3, 5)}, "sd3": {"even": (4, 8), "uneven": (3, 5)},
          "qwen_image": {"even": (4, 8), "uneven": (3, 5)},
          "flux2": {"even": (4, 4), "uneven": (3, 5)}}


def build(family: str, seed: int = 0, **overrides):
    """A tiny fp32 model of ``family`` in train mode, the same weights for the same seed."""
    import diffusers

    from opendit_lite.parallelization import freeze_unused_parameters

    cls_name, config = CONFIGS[family]
    torch.manual_seed(seed)
    # frozen as parallelize freezes them: the parameters in no step's graph (the last block's text outputs)
    model = getattr(diffusers, cls_name)(**{**config, **overrides}).float().train()
    freeze_unused_parameters(model)
    return model


def inputs(family: str, model, batch: int = 2, variant: str = "uneven", seed: int = 1) -> dict:
    """Forward keyword arguments of ``model`` (of ``family``) for a batch of ``variant`` token counts."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    if family == "flux" and variant == "kontext":
        return _kontext(inputs(family, model, batch, "uneven", seed),
                        torch.randn(batch, 6, cfg.in_channels, generator=torch.Generator().manual_seed(seed + 1)))
    grid = _GRIDS[family][variant]

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    def steps():
        return torch.randint(0, 1000, (batch,), generator=g)

    if family == "wan":
        return dict(hidden_states=rand(batch, cfg.in_channels, *grid), timestep=steps(),
                    encoder_hidden_states=rand(batch, 12, cfg.text_dim), return_dict=False)
    if family == "flux":
        h, w = grid
        img_ids = torch.zeros(h, w, 3)
        img_ids[..., 1], img_ids[..., 2] = torch.arange(h)[:, None], torch.arange(w)[None, :]
        return dict(hidden_states=rand(batch, h * w, cfg.in_channels), encoder_hidden_states=rand(batch, 7, 32),
                    pooled_projections=rand(batch, cfg.pooled_projection_dim), timestep=torch.rand(batch, generator=g),
                    guidance=torch.full((batch,), 3.5), img_ids=img_ids.reshape(h * w, 3), txt_ids=torch.zeros(7, 3),
                    return_dict=False)
    if family == "cogvideox":
        f, h, w = grid
        return dict(hidden_states=rand(batch, f, cfg.in_channels, h, w),
                    encoder_hidden_states=rand(batch, cfg.max_text_seq_length, cfg.text_embed_dim),
                    timestep=steps(), return_dict=False)
    if family == "hunyuan_video":
        mask = torch.ones(batch, 12)
        mask[0, 9:] = 0
        return dict(hidden_states=rand(batch, cfg.in_channels, *grid), timestep=steps().float(),
                    encoder_hidden_states=rand(batch, 12, cfg.text_embed_dim), encoder_attention_mask=mask,
                    pooled_projections=rand(batch, cfg.pooled_projection_dim), guidance=torch.full((batch,), 6.0),
                    return_dict=False)
    if family == "hunyuan_video15":  # caption (sample 0 masks 3), glyph text (sample 1 has none), image states
        mask, mask_2 = torch.ones(batch, 12), torch.ones(batch, 5)
        mask[0, 9:], mask_2[0, 3:], mask_2[1:] = 0, 0, 0
        return dict(hidden_states=rand(batch, cfg.in_channels, *grid), timestep=steps().float(),
                    encoder_hidden_states=rand(batch, 12, cfg.text_embed_dim), encoder_attention_mask=mask,
                    encoder_hidden_states_2=rand(batch, 5, cfg.text_embed_2_dim), encoder_attention_mask_2=mask_2,
                    image_embeds=rand(batch, 3, cfg.image_embed_dim), return_dict=False)
    if family == "ltx_video":
        f, h, w = grid
        mask = torch.ones(batch, 16)
        mask[0, 11:] = 0
        return dict(hidden_states=rand(batch, f * h * w, cfg.in_channels),
                    encoder_hidden_states=rand(batch, 16, cfg.caption_channels), timestep=steps(),
                    encoder_attention_mask=mask, num_frames=f, height=h, width=w, return_dict=False)
    if family == "sd3":
        return dict(hidden_states=rand(batch, cfg.in_channels, *grid), encoder_hidden_states=rand(batch, 10, 32),
                    pooled_projections=rand(batch, cfg.pooled_projection_dim), timestep=steps(), return_dict=False)
    if family == "qwen_image":
        h, w = grid
        mask = torch.ones(batch, 9, dtype=torch.long)
        mask[0, 6:] = 0
        return dict(hidden_states=rand(batch, h * w, cfg.in_channels), encoder_hidden_states=rand(batch, 9, 16),
                    encoder_hidden_states_mask=mask, timestep=torch.rand(batch, generator=g),
                    img_shapes=[[(1, h, w)]] * batch, return_dict=False)
    if family == "flux2":  # batched four-axis ids, as Flux2Pipeline passes them: (0, row, column, 0), (0, 0, 0, l)
        h, w = grid
        img_ids = torch.zeros(h, w, 4, dtype=torch.long)
        img_ids[..., 1], img_ids[..., 2] = torch.arange(h)[:, None], torch.arange(w)[None, :]
        txt_ids = torch.zeros(7, 4, dtype=torch.long)
        txt_ids[:, 3] = torch.arange(7)
        return dict(hidden_states=rand(batch, h * w, cfg.in_channels), encoder_hidden_states=rand(batch, 7, 24),
                    timestep=torch.rand(batch, generator=g), guidance=torch.full((batch,), 4.0),
                    img_ids=img_ids.reshape(1, h * w, 4).expand(batch, -1, -1),
                    txt_ids=txt_ids[None].expand(batch, -1, -1), return_dict=False)
    raise KeyError(family)


def _kontext(target: dict, reference: torch.Tensor) -> dict:
    """FLUX.1 Kontext's transformer inputs: a reference's packed 2 x 3 tokens [B, 6, C] after the target's on
    the sequence axis, with ids (1, row, column) after the target's (0, row, column), as its pipeline joins them."""
    ids = torch.ones(2, 3, 3)
    ids[..., 1], ids[..., 2] = torch.arange(2)[:, None], torch.arange(3)[None, :]
    return dict(target, hidden_states=torch.cat([target["hidden_states"], reference], dim=1),  # [B, 15 + 6, C]
                img_ids=torch.cat([target["img_ids"], ids.reshape(6, 3)]))                    # [21, 3]
