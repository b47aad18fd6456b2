"""The parts the tiny random pipelines of the families share (each family's own builders are in its
``<family>/tiny.py``; ``tiny_pipelines.py`` collects them): tokenizers and text encoders built offline
at test size, diffusers models built under a seed, the flow-matching scheduler and the image VAE of
Flux and SD3.

Tokenizers cover ``CAPTION_WORDS`` (and HunyuanVideo's prompt template) with whole-word tokens and
fall back to characters (T5) or bytes (CLIP, Llama) for any other text. The Llama vocabulary splits
text like Llama 3's pre-tokenizer, so HunyuanVideo's template prefix is 95 tokens, the
``crop_start`` its pipeline assumes.

Nothing here imports diffusers, transformers or tokenizers at import time.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Sequence

import torch


@dataclass(frozen=True)
class TinyPipeline:
    """A tiny random pipeline of one released layout: its name (``make_tiny_pipeline.py --family``),
    ``build(seed)`` -> the pipeline in memory (eval mode), and the keyword arguments of a fast
    ``__call__`` (sizes its VAE and patches divide; a CPU runs it in seconds)."""

    name: str
    build: Callable[[int], Any]
    call: Dict[str, Any] = field(default_factory=dict)

# Words the tokenizers hold whole (any other word is spelled out): the captions tests use.
CAPTION_WORDS = (
    "a an the of on in with and to at by photo video clip image picture scene close up view shot "
    "red blue green yellow white black orange purple gray pink dark bright small large big tiny "
    "square disc circle triangle ball cube cat dog bird car tree house sky sea mountain road person man woman "
    "moving moves move left right up down fast slow slowly quickly rotating spinning falling flying running "
    "walking jumping sitting standing background foreground light shadow sunset night day city street water"
).split()

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


def byte_level_bpe(split: str, special: Sequence[str], texts: Sequence[str]):
    """A byte-level BPE ``tokenizers.Tokenizer`` (GPT-2 / Llama 3 / Qwen / Mistral style) that pre-splits with
    the regex ``split``, has the ``special`` tokens and is trained so that the words of ``texts`` are whole
    tokens: the base of the tiny pipelines' Llama, Qwen and Mistral tokenizers."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1 << 20, special_tokens=list(special), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(list(texts), trainer)
    return tokenizer


def llama_tokenizer(words: Sequence[str] = CAPTION_WORDS, texts: Sequence[str] = ()):
    """A Llama 3 style tokenizer: byte-level BPE over Llama 3's split, trained so that ``words`` and the
    words of ``texts`` are whole tokens, with ``<|begin_of_text|>`` prepended to every input and
    Llama 3's header and end-of-turn tokens; right padding with ``<pad>``. Saved and loaded as
    transformers' generic fast tokenizer (the tokenizer.json as it is)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = byte_level_bpe(_LLAMA3_SPLIT, _LLAMA_SPECIAL, [" ".join(words), *texts])
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

def diffusers_model(name: str, seed: int, **config) -> torch.nn.Module:
    """The diffusers class ``name`` built from ``config`` under ``seed``."""
    import diffusers

    torch.manual_seed(seed)
    return getattr(diffusers, name)(**config)


def random_transformer(name: str, seed: int, **config) -> torch.nn.Module:
    """A diffusers transformer with every weight moved off its initial value (diffusers starts some
    output layers at zero), so that every input changes the prediction."""
    model = diffusers_model(name, seed, **config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def flow_scheduler(**config):
    """diffusers' ``FlowMatchEulerDiscreteScheduler`` over 1000 training steps, configured by ``config``."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, **config)


def kl_image_vae(seed: int, scaling: float, shift: float):
    """The 16-channel image VAE of Flux and SD3 (no quant convs), 2x here, 8x in the release."""
    vae = diffusers_model("AutoencoderKL", seed, block_out_channels=(8, 8),
                          down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                          latent_channels=16, norm_num_groups=4, scaling_factor=scaling, shift_factor=shift,
                          use_quant_conv=False, use_post_quant_conv=False)
    return vae.eval()
