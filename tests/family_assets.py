"""Tiny random stand-ins for the diffusers families' VAEs and text encoders, saved like a
downloaded pipeline folder (``vae/``, ``text_encoder[_N]/``, ``tokenizer[_N]/``) with
save_pretrained, so that scripts reading local folders run on them without any download."""

import os

import torch

WORDS = ("a", "red", "blue", "green", "square", "disc", "moving", "left", "right", "up", "down", "fast")

VAES = {  # family -> (diffusers VAE class, constructor arguments): 1-2 levels, 8 channels wide
    "wan": ("AutoencoderKLWan", dict(base_dim=8, z_dim=4, dim_mult=[1, 1], num_res_blocks=1,
                                     temperal_downsample=[False], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                     latents_std=[1.5, 0.5, 2.0, 1.0])),
    "cogvideox": ("AutoencoderKLCogVideoX", dict(
        block_out_channels=(8, 8), down_block_types=("CogVideoXDownBlock3D",) * 2,
        up_block_types=("CogVideoXUpBlock3D",) * 2, latent_channels=4, layers_per_block=1, norm_num_groups=2,
        temporal_compression_ratio=4, scaling_factor=0.7)),
    "hunyuanvideo": ("AutoencoderKLHunyuanVideo", dict(
        block_out_channels=(8, 8), down_block_types=("HunyuanVideoDownBlock3D",) * 2,
        up_block_types=("HunyuanVideoUpBlock3D",) * 2, latent_channels=4, layers_per_block=1, norm_num_groups=2,
        spatial_compression_ratio=2, temporal_compression_ratio=4, scaling_factor=0.5)),
    "ltx": ("AutoencoderKLLTXVideo", dict(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False), decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False,) * 5, upsample_residual=(False,) * 4, upsample_factor=(1,) * 4,
        timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False,
        scaling_factor=0.8)),
    "flux": ("AutoencoderKL", dict(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                                   up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=16, norm_num_groups=4,
                                   scaling_factor=0.36, shift_factor=0.12)),
}
VAES["sd3"] = (VAES["flux"][0], dict(VAES["flux"][1], scaling_factor=1.5, shift_factor=0.06))

TEXT_MODELS = {"wan": "umt5", "hunyuanvideo": "llama"}  # the others: t5


def tiny_vae(family: str, seed: int = 0) -> torch.nn.Module:
    import diffusers

    name, config = VAES[family]
    torch.manual_seed(seed)
    vae = getattr(diffusers, name)(**config)
    if family == "ltx":  # the per-channel statistics are buffers; give them non-trivial values
        vae.latents_mean.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0] + [0.0] * (vae.latents_mean.numel() - 4)))
        vae.latents_std.copy_(torch.linspace(0.5, 2.0, vae.latents_std.numel()))
    return vae.eval()


def tiny_text_model(kind: str, width: int = 16, seed: int = 0) -> torch.nn.Module:
    import transformers

    torch.manual_seed(seed)
    if kind == "llama":
        return transformers.LlamaModel(transformers.LlamaConfig(
            vocab_size=len(WORDS) + 2, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2)).eval()
    config_cls, model_cls = {"t5": ("T5Config", "T5EncoderModel"), "umt5": ("UMT5Config", "UMT5EncoderModel")}[kind]
    config = getattr(transformers, config_cls)(vocab_size=len(WORDS) + 2, d_model=width, d_kv=8, d_ff=2 * width,
                                                num_layers=1, num_heads=2)
    return getattr(transformers, model_cls)(config).eval()


def save_tokenizer(path) -> str:
    """A word-level tokenizer over ``WORDS`` (pad id 0), saved like a pipeline's tokenizer/."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(path)
    return str(path)


def save_tiny_pipeline(root, family: str) -> str:
    """``root`` laid out as the family's diffusers pipeline: its VAE and the text encoder (with its
    tokenizer) the family's transformer reads."""
    from opendit_lite.families import find_family

    text, tokenizer = find_family(family).encoding.text_folders
    tiny_vae(family).save_pretrained(os.path.join(root, "vae"))
    tiny_text_model(TEXT_MODELS.get(family, "t5")).save_pretrained(os.path.join(root, text))
    save_tokenizer(os.path.join(root, tokenizer))
    return str(root)
