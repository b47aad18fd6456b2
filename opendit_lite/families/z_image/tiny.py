"""The tiny random pipelines of Z-Image's two released layouts, for tests and
``scripts/make_tiny_pipeline.py``: ``z_image`` (the base model, sampled with classifier-free guidance,
``ZImagePipeline``'s default ``guidance_scale`` 5) and ``z_image_turbo`` (the few-step model distilled
from guidance, sampled with ``guidance_scale=0``: one transformer call per step, no unconditional
branch). Both are ``ZImagePipeline`` folders of the same classes; the released configs differ in the
weights only, so the two tiny pipelines differ in the call they are sampled with.

The text encoder is a Qwen3 model (``Qwen3Model``, the pipeline reads its second-to-last hidden state)
and its tokenizer a byte-level BPE with Qwen's chat tokens and a chat template that, as Qwen3's,
wraps a user turn in ``<|im_start|>`` / ``<|im_end|>`` and opens the assistant's turn (with
``enable_thinking`` true, the pipeline's setting, nothing more is added).
"""

import torch

from ..tiny_parts import (
    CAPTION_WORDS,
    TinyPipeline,
    byte_level_bpe,
    flow_scheduler,
    kl_image_vae,
    random_transformer,
)

_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen3's chat template for the turns ZImagePipeline builds (one user message, the generation prompt).
_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")
# Qwen2/3's pre-tokenizer split (as GPT-4's): contractions, letter runs, single digits, punctuation, spaces.
_QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen3_tokenizer():
    """A Qwen3 style tokenizer: byte-level BPE over Qwen's split whose merges hold ``CAPTION_WORDS`` and
    the chat template's words whole, no token prepended, ``<|endoftext|>`` the padding (right), and
    the chat template above. Saved and loaded as transformers' generic fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = byte_level_bpe(_QWEN_SPLIT, _QWEN_SPECIAL, [" ".join(CAPTION_WORDS), "user\nassistant\n"])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   padding_side="right", model_max_length=131072, chat_template=_CHAT_TEMPLATE)


def qwen3_encoder(tokenizer, width: int):
    """A Qwen3 model with two layers (the pipeline reads the second-to-last hidden state), ``width`` wide."""
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=width // 2, max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    return transformers.Qwen3Model(config).eval()


def build_z_image(seed: int = 0):
    """Z-Image (``ZImagePipeline``): a Qwen3 text encoder (16 wide, the caption padded to ``__call__``'s
    512 tokens and cut to its real tokens), the transformer's 2x2 patches, noise and context refiners
    and main layers (one each, 32 wide, 2 heads, rope axes 4 + 6 + 6), Flux's 16-channel VAE with its
    0.3611 scale and 0.1159 shift, and the release's scheduler: a fixed shift of 3."""
    from diffusers import ZImagePipeline

    tokenizer = qwen3_tokenizer()
    transformer = random_transformer(
        "ZImageTransformer2DModel", seed, all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32,
        n_layers=1, n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6],
        axes_lens=[1024, 64, 64])
    vae = kl_image_vae(seed + 1, 0.3611, 0.1159)
    torch.manual_seed(seed + 2)
    return ZImagePipeline(scheduler=flow_scheduler(shift=3.0, use_dynamic_shifting=False), vae=vae,
                          text_encoder=qwen3_encoder(tokenizer, 16), tokenizer=tokenizer, transformer=transformer)


TINY = (TinyPipeline("z_image", build_z_image, dict(height=32, width=32, num_inference_steps=2)),
        TinyPipeline("z_image_turbo", build_z_image, dict(height=32, width=32, num_inference_steps=2,
                                                          guidance_scale=0.0)))
