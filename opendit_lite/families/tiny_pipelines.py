"""Tiny random diffusers pipelines laid out like the seven released models the families fine-tune:
Wan 2.1 (``WanPipeline``), Wan 2.2 A14B (``WanPipeline`` with ``transformer_2`` and
``boundary_ratio``), HunyuanVideo, CogVideoX (5B), LTX-Video, Flux (dev) and SD3.

Each ``build_<family>()`` returns the pipeline in memory, every component built from its library's
config at test size (2 heads, widths 8-32, 1-3 layers) with the release's structure: the text
encoders and tokenizer classes its pipeline loads (T5 / UMT5 with ``<pad>`` = 0, ``</s>``, ``<unk>``;
CLIP with its start/end tokens and 77 positions; a Llama-3 style byte-level BPE with its header and
end-of-turn tokens), the VAE class with the release's normalisation constants, and the scheduler
configured as the release configures it. ``save_tiny_pipeline(family, out)`` writes it with
``save_pretrained``, so that ``DiffusionPipeline.from_pretrained(out)`` loads it and its ``__call__``
runs in seconds on a CPU at the sizes of ``TINY_CALLS``. Nothing is downloaded.

Tokenizers cover ``CAPTION_WORDS`` (and HunyuanVideo's prompt template) with whole-word tokens and
fall back to characters (T5) or bytes (CLIP, Llama) for any other text. The Llama vocabulary splits
text like Llama 3's pre-tokenizer, so HunyuanVideo's template prefix is 95 tokens, the
``crop_start`` its pipeline assumes.

Nothing here imports diffusers, transformers or tokenizers at import time.
"""

import os
import shutil
from typing import Callable, Dict, Sequence

import torch

from ..errors import ConfigError

FAMILIES = ("wan", "wan22", "hunyuanvideo", "cogvideox", "ltx", "flux", "sd3")

# Words the tokenizers hold whole (any other word is spelled out): the captions tests use.
CAPTION_WORDS = (
    "a an the of on in with and to at by photo video clip image picture scene close up view shot "
    "red blue green yellow white black orange purple gray pink dark bright small large big tiny "
    "square disc circle triangle ball cube cat dog bird car tree house sky sea mountain road person man woman "
    "moving moves move left right up down fast slow slowly quickly rotating spinning falling flying running "
    "walking jumping sitting standing background foreground light shadow sunset night day city street water"
).split()

# Per family: the keyword arguments of a fast ``__call__`` (sizes the VAE and patches divide).
TINY_CALLS: Dict[str, dict] = {
    "wan": dict(height=32, width=32, num_frames=5, num_inference_steps=2),
    "wan22": dict(height=32, width=32, num_frames=5, num_inference_steps=3),
    "hunyuanvideo": dict(height=32, width=32, num_frames=5, num_inference_steps=2),
    "cogvideox": dict(height=32, width=32, num_frames=9, num_inference_steps=2),
    "ltx": dict(height=32, width=32, num_frames=9, num_inference_steps=2),
    "flux": dict(height=32, width=32, num_inference_steps=2),
    "sd3": dict(height=32, width=32, num_inference_steps=2),
}

# Llama 3's pre-tokenizer split (contractions, letter runs with one leading non-letter, 1-3 digits,
# punctuation runs, newlines, spaces): with whole-word merges, token counts match Llama 3's.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<pad>")
_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,:;!?'\"-()/&"


# ------------------------------------------------------------------------------------------ tokenizers

def t5_tokenizer(words: Sequence[str] = CAPTION_WORDS, max_length: int = 512):
    """A T5 / UMT5 tokenizer (transformers' ``T5Tokenizer``, a Unigram model): ``<pad>`` 0, ``</s>``
    1, ``<unk>`` 2, then the words whole and single characters as the fallback."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
    pieces += [("\u2581" + w, -1.0) for w in sorted(set(words))]
    pieces += [(c, -8.0) for c in _CHARS]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=max_length)


def clip_tokenizer(words: Sequence[str] = CAPTION_WORDS):
    """A CLIP tokenizer (transformers' ``CLIPTokenizer``: byte-level BPE with ``</w>`` word ends, 77
    tokens; ``<|startoftext|>`` 0, ``<|endoftext|>`` 1, also the padding) whose merges build ``words``
    (lower-case ASCII) whole, with every single byte a token of its own as the fallback."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = _learn_merges(sorted(set(w.lower() for w in words)))
    tokens = ["<|startoftext|>", "<|endoftext|>", *alphabet, *(c + "</w>" for c in alphabet),
              *(a + b for a, b in merges)]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


def _learn_merges(words: Sequence[str]) -> list:
    """BPE merges (with CLIP's ``</w>`` word ends) that join each of ``words`` into one token: merge the
    most frequent adjacent pair (ties: the smallest) until every word is a single symbol. Written
    out rather than left to the tokenizers library's trainer, whose ids vary from run to run."""
    from collections import Counter

    words = [list(w[:-1]) + [w[-1] + "</w>"] for w in words if w]
    merges = []
    while True:
        counts = Counter(pair for w in words for pair in zip(w, w[1:]))
        if not counts:
            return merges
        pair = min(counts, key=lambda p: (-counts[p], p))
        merges.append(pair)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == pair:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1


def llama_tokenizer(words: Sequence[str] = CAPTION_WORDS, texts: Sequence[str] = ()):
    """A Llama 3 style tokenizer: byte-level BPE over Llama 3's split, trained so that ``words`` and the
    words of ``texts`` are whole tokens, with ``<|begin_of_text|>`` prepended to every input and
    Llama 3's header and end-of-turn tokens; right padding with ``<pad>``. Saved and loaded as
    transformers' generic fast tokenizer (the tokenizer.json as it is)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1 << 20, special_tokens=list(_LLAMA_SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([" ".join(words), *texts], trainer)
    bos = _LLAMA_SPECIAL[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos, eos_token=_LLAMA_SPECIAL[1],
                                   pad_token="<pad>", padding_side="right", model_max_length=2048)


# --------------------------------------------------------------------------------------- text encoders

def t5_encoder(tokenizer, width: int, umt5: bool = False):
    """A T5 (or UMT5) encoder, v1.1 style (gated GELU), one layer, ``width`` wide."""
    import transformers

    config_cls, model_cls = ("UMT5Config", "UMT5EncoderModel") if umt5 else ("T5Config", "T5EncoderModel")
    config = getattr(transformers, config_cls)(
        vocab_size=len(tokenizer), d_model=width, d_kv=width // 2, d_ff=2 * width, num_layers=1, num_heads=2,
        feed_forward_proj="gated-gelu", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id)
    return getattr(transformers, model_cls)(config).eval()


def clip_encoder(tokenizer, width: int, projection: int = 0):
    """A CLIP text model with two layers (the pipelines read the second to last), ``width`` wide;
    ``projection`` > 0: with its text projection (``CLIPTextModelWithProjection``, SD3's)."""
    import transformers

    config = transformers.CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, projection_dim=projection or width,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    cls = transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel
    return cls(config).eval()


def llama_encoder(tokenizer, width: int):
    """A Llama model with three layers (HunyuanVideo reads the third to last hidden state), ``width`` wide."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return transformers.LlamaModel(config).eval()


# -------------------------------------------------------------------------------------------- models

def _diffusers(name: str, seed: int, **config) -> torch.nn.Module:
    """The diffusers class ``name`` built from ``config`` under ``seed``."""
    import diffusers

    torch.manual_seed(seed)
    return getattr(diffusers, name)(**config)


def _transformer(name: str, seed: int, **config) -> torch.nn.Module:
    """A diffusers transformer with every weight moved off its initial value (diffusers starts some
    output layers at zero), so that every input changes the prediction."""
    model = _diffusers(name, seed, **config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def _flow_scheduler(**config):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, **config)


def _wan_parts(seed: int) -> dict:
    """Wan 2.x's shared parts: UMT5 (32 wide), the 16-channel Wan VAE with the release's per-channel
    latent mean and std (its defaults; 4x in time and space here, 4x8x8 in the release)."""
    tokenizer = t5_tokenizer()
    vae = _diffusers("AutoencoderKLWan", seed + 1, base_dim=8, z_dim=16, dim_mult=[1, 1, 1], num_res_blocks=1,
                     temperal_downsample=[True, True], scale_factor_temporal=4, scale_factor_spatial=4)
    torch.manual_seed(seed + 2)
    return dict(tokenizer=tokenizer, text_encoder=t5_encoder(tokenizer, 32, umt5=True), vae=vae.eval())


_WAN_TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
                        out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                        qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def _unipc_flow(shift: float):
    """Wan's scheduler: UniPC on flow sigmas with the release's ``flow_shift``."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift,
                                   num_train_timesteps=1000)


# ------------------------------------------------------------------------------------------ families

def build_wan(seed: int = 0):
    """Wan 2.1 text-to-video (``WanPipeline``): UMT5, Wan VAE, UniPC with flow shift 3 (480p)."""
    from diffusers import WanPipeline

    return WanPipeline(transformer=_transformer("WanTransformer3DModel", seed, **_WAN_TRANSFORMER),
                       scheduler=_unipc_flow(3.0), **_wan_parts(seed))


def build_wan22(seed: int = 0):
    """Wan 2.2 A14B text-to-video: two experts, ``transformer`` for times at or above
    ``boundary_ratio`` x 1000 (high noise) and ``transformer_2`` below it; flow shift 12."""
    from diffusers import WanPipeline

    return WanPipeline(transformer=_transformer("WanTransformer3DModel", seed, **_WAN_TRANSFORMER),
                       transformer_2=_transformer("WanTransformer3DModel", seed + 7, **_WAN_TRANSFORMER),
                       boundary_ratio=0.875, scheduler=_unipc_flow(12.0), **_wan_parts(seed))


def build_hunyuanvideo(seed: int = 0):
    """HunyuanVideo (``HunyuanVideoPipeline``): Llama (16 wide; its prompt template), CLIP-L's pooled
    output (16 wide), the guidance-distilled transformer, its VAE (scaling 0.476986), flow shift 7."""
    from diffusers import HunyuanVideoPipeline
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    tokenizer = llama_tokenizer(texts=[DEFAULT_PROMPT_TEMPLATE["template"].replace("{}", "")])
    tokenizer_2 = clip_tokenizer()
    transformer = _transformer(
        "HunyuanVideoTransformer3DModel", seed, in_channels=4, out_channels=4, num_attention_heads=2,
        attention_head_dim=10, num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1,
        guidance_embeds=True, text_embed_dim=16, pooled_projection_dim=16, rope_axes_dim=(2, 4, 4))
    vae = _diffusers("AutoencoderKLHunyuanVideo", seed + 1, block_out_channels=(8, 8, 8),
                     down_block_types=("HunyuanVideoDownBlock3D",) * 3, up_block_types=("HunyuanVideoUpBlock3D",) * 3,
                     latent_channels=4, layers_per_block=1, norm_num_groups=2, spatial_compression_ratio=4,
                     temporal_compression_ratio=4, scaling_factor=0.476986)
    torch.manual_seed(seed + 2)
    return HunyuanVideoPipeline(
        tokenizer=tokenizer, text_encoder=llama_encoder(tokenizer, 16), tokenizer_2=tokenizer_2,
        text_encoder_2=clip_encoder(tokenizer_2, 16), transformer=transformer, vae=vae.eval(),
        scheduler=_flow_scheduler(shift=7.0))


def build_cogvideox(seed: int = 0):
    """CogVideoX 5B (``CogVideoXPipeline``): T5 (32 wide, 226 tokens), 3-D rotary embedding on a base
    grid of 4x6 patches, its VAE (scaling 0.7), v-prediction DDIM with zero terminal SNR, SNR shift 1."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXPipeline

    tokenizer = t5_tokenizer(max_length=226)
    transformer = _transformer(
        "CogVideoXTransformer3DModel", seed, num_attention_heads=2, attention_head_dim=16, in_channels=4,
        out_channels=4, time_embed_dim=4, text_embed_dim=32, num_layers=2, sample_width=12, sample_height=8,
        sample_frames=5, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=226,
        use_rotary_positional_embeddings=True)
    vae = _diffusers("AutoencoderKLCogVideoX", seed + 1, block_out_channels=(8, 8, 8),
                     down_block_types=("CogVideoXDownBlock3D",) * 3, up_block_types=("CogVideoXUpBlock3D",) * 3,
                     latent_channels=4, layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4,
                     scaling_factor=0.7)
    scheduler = CogVideoXDDIMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=True,
        prediction_type="v_prediction", rescale_betas_zero_snr=True, snr_shift_scale=1.0, timestep_spacing="trailing")
    torch.manual_seed(seed + 2)
    return CogVideoXPipeline(tokenizer=tokenizer, text_encoder=t5_encoder(tokenizer, 32), vae=vae.eval(),
                             transformer=transformer, scheduler=scheduler)


def build_ltx(seed: int = 0):
    """LTX-Video (``LTXVideoPipeline``): T5 (32 wide, 128 tokens), its VAE (8 latent channels with a
    per-channel mean and std; 4x in time and space here, 8x32x32 in the release), the release's
    token-count shift (0.95 at 1024 tokens .. 2.05 at 4096, terminal sigma 0.1)."""
    from diffusers import LTXPipeline

    tokenizer = t5_tokenizer(max_length=128)
    transformer = _transformer(
        "LTXVideoTransformer3DModel", seed, in_channels=8, out_channels=8, num_attention_heads=2,
        attention_head_dim=8, cross_attention_dim=16, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=32)
    vae = _diffusers("AutoencoderKLLTXVideo", seed + 1, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                     decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                     decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
                     decoder_spatio_temporal_scaling=(True, True, False, False), decoder_inject_noise=(False,) * 5,
                     upsample_residual=(False,) * 4, upsample_factor=(1,) * 4, timestep_conditioning=False,
                     patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False, scaling_factor=1.0)
    with torch.no_grad():  # the statistics are buffers, saved with the weights; the release's are not 0 and 1
        vae.latents_mean.copy_(torch.linspace(-0.3, 0.3, vae.latents_mean.numel()))
        vae.latents_std.copy_(torch.linspace(0.5, 2.0, vae.latents_std.numel()))
    scheduler = _flow_scheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1)
    torch.manual_seed(seed + 2)
    return LTXPipeline(tokenizer=tokenizer, text_encoder=t5_encoder(tokenizer, 32), vae=vae.eval(),
                       transformer=transformer, scheduler=scheduler)


def _kl_vae(seed: int, scaling: float, shift: float):
    """The 16-channel image VAE of Flux and SD3 (no quant convs), 2x here, 8x in the release."""
    vae = _diffusers("AutoencoderKL", seed, block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                     up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=16, norm_num_groups=4,
                     scaling_factor=scaling, shift_factor=shift, use_quant_conv=False, use_post_quant_conv=False)
    return vae.eval()


def build_flux(seed: int = 0):
    """Flux dev (``FluxPipeline``): CLIP-L's pooled output (16 wide) and T5 (32 wide, 512 tokens), the
    guidance-distilled transformer, the VAE's 0.3611 scale and 0.1159 shift, token-count shift
    (0.5 at 256 tokens .. 1.15 at 4096)."""
    from diffusers import FluxPipeline

    tokenizer, tokenizer_2 = clip_tokenizer(), t5_tokenizer()
    transformer = _transformer(
        "FluxTransformer2DModel", seed, patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16,
        guidance_embeds=True, axes_dims_rope=[2, 2, 4])
    scheduler = _flow_scheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                base_image_seq_len=256, max_image_seq_len=4096)
    vae = _kl_vae(seed + 1, 0.3611, 0.1159)
    torch.manual_seed(seed + 2)
    return FluxPipeline(tokenizer=tokenizer, text_encoder=clip_encoder(tokenizer, 16), tokenizer_2=tokenizer_2,
                        text_encoder_2=t5_encoder(tokenizer_2, 32), transformer=transformer, vae=vae,
                        scheduler=scheduler)


def build_sd3(seed: int = 0):
    """SD3 medium (``StableDiffusion3Pipeline``): CLIP-L (12 wide, projection 8) and CLIP-G (16 wide,
    projection 12), whose second-to-last states are joined and padded to T5's 32 (77 + 256 tokens)
    and whose projections make the 20-wide pooled text; the VAE's 1.5305 scale and 0.0609 shift,
    flow shift 3."""
    from diffusers import StableDiffusion3Pipeline

    tokenizer, tokenizer_2, tokenizer_3 = clip_tokenizer(), clip_tokenizer(), t5_tokenizer()
    transformer = _transformer(
        "SD3Transformer2DModel", seed, sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=32,
        pooled_projection_dim=20, pos_embed_max_size=32)
    vae = _kl_vae(seed + 1, 1.5305, 0.0609)
    torch.manual_seed(seed + 2)
    return StableDiffusion3Pipeline(
        tokenizer=tokenizer, text_encoder=clip_encoder(tokenizer, 12, projection=8), tokenizer_2=tokenizer_2,
        text_encoder_2=clip_encoder(tokenizer_2, 16, projection=12), tokenizer_3=tokenizer_3,
        text_encoder_3=t5_encoder(tokenizer_3, 32), transformer=transformer, vae=vae,
        scheduler=_flow_scheduler(shift=3.0))


BUILDERS: Dict[str, Callable] = {
    "wan": build_wan, "wan22": build_wan22, "hunyuanvideo": build_hunyuanvideo, "cogvideox": build_cogvideox,
    "ltx": build_ltx, "flux": build_flux, "sd3": build_sd3,
}


def build_tiny_pipeline(family: str, seed: int = 0):
    """The tiny random pipeline of ``family`` (one of ``FAMILIES``), in memory, in eval mode."""
    if family not in BUILDERS:
        raise ConfigError(f"unknown family {family!r} for a tiny pipeline; choose one of {', '.join(FAMILIES)}.")
    return BUILDERS[family](seed)


def save_tiny_pipeline(family: str, out: str, seed: int = 0, overwrite: bool = False) -> str:
    """Build ``family``'s tiny pipeline and write it to the folder ``out`` with ``save_pretrained``; an
    existing non-empty ``out`` is a ConfigError unless ``overwrite`` (then it is replaced)."""
    if family not in BUILDERS:
        raise ConfigError(f"unknown family {family!r} for a tiny pipeline; choose one of {', '.join(FAMILIES)}.")
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ConfigError(f"the output {out!r} is an existing file; give a folder for the pipeline.")
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise ConfigError(f"the output folder {out!r} is not empty; give a new folder, or pass --overwrite to "
                              f"replace what it holds.")
        shutil.rmtree(out)
    build_tiny_pipeline(family, seed).save_pretrained(out, safe_serialization=True)
    return out
