"""Tiny random pipelines of Qwen-Image's released layouts, for tests and ``scripts/make_tiny_pipeline.py``:
text-to-image (``qwenimage``, ``QwenImagePipeline``) and its edit pipelines (``qwenimage_edit``,
``QwenImageEditPipeline``; ``qwenimage_edit_plus``, ``QwenImageEditPlusPipeline``).

The text encoder is a Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``, two text layers 32 wide and
one vision layer) with a Qwen2 byte-level BPE tokenizer (``Qwen2Tokenizer``) that holds the chat
template's special tokens (``<|im_start|>``, ``<|im_end|>``, the vision markers and ``<|image_pad|>``)
and the words of the pipelines' prompt templates whole, so that each template's system prefix is as
many tokens as with the released tokenizer: 34 for text-to-image, 64 for edit, the
``prompt_template_encode_start_idx`` the pipelines drop. The edit pipelines' ``Qwen2VLProcessor``
pairs that tokenizer with a ``Qwen2VLImageProcessor`` (14-pixel patches merged 2x2, as released;
a small pixel budget here).
"""

import re

import torch

from ..tiny_parts import CAPTION_WORDS, TinyPipeline, diffusers_model, flow_scheduler, random_transformer

# The Qwen2 chat tokens the pipelines' templates and the vision processor use.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>")
# Qwen2's pre-tokenizer split (transformers' Qwen2Tokenizer splits text the same way).
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXT_WIDTH = 32       # the text encoder's hidden size: the transformer's joint_attention_dim


def qwen_tokenizer(texts=()):
    """A ``Qwen2Tokenizer`` whose BPE merges hold ``CAPTION_WORDS`` and the words of ``texts`` (the
    prompt templates, special tokens cut out) whole, bytes as the fallback, and ``SPECIAL_TOKENS``
    as special added tokens; ``<|endoftext|>`` pads, on the right."""
    import json

    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    pieces = [" ".join(CAPTION_WORDS)]
    special = "|".join(map(re.escape, SPECIAL_TOKENS))
    pieces += [p for text in texts for p in re.split(special, text) if p]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=1 << 20, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(pieces, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, model_max_length=32768)
    tokenizer.add_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS[1:]])
    return tokenizer


def qwen25_vl_encoder(tokenizer, seed: int):
    """A Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): two text layers ``TEXT_WIDTH`` wide with
    multimodal rotary sections, one vision layer (14-pixel patches, 2x2 merge) projecting to the text
    width; the vision token ids are the tokenizer's."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=TEXT_WIDTH, intermediate_size=2 * TEXT_WIDTH,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=ids("<|endoftext|>"),
                         eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
                         rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[2, 3, 3])),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TEXT_WIDTH,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[0]),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def qwen_vl_processor(tokenizer):
    """The edit pipelines' ``Qwen2VLProcessor``: ``tokenizer`` with a ``Qwen2VLImageProcessor`` of the
    release's patching (14 pixels, 2x2 merge, 2 frames per temporal patch) whose pixel budget keeps a
    tiny image to a few patches (its video processor, which the processor requires, the same)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    patching = dict(min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2, temporal_patch_size=2)
    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**patching), tokenizer=tokenizer,
                            video_processor=Qwen2VLVideoProcessor(**patching))


def qwen_image_vae(seed: int):
    """``AutoencoderKLQwenImage`` (the Wan 2.1 VAE's causal 3D layout, images as 1-frame clips) with the
    release's per-channel latent mean and std (its defaults); 2x here, 8x in the release."""
    vae = diffusers_model("AutoencoderKLQwenImage", seed, base_dim=8, z_dim=16, dim_mult=[1, 1], num_res_blocks=1,
                          temperal_downsample=[False])
    return vae.eval()


def qwen_image_scheduler():
    """Qwen-Image's scheduler: flow matching, dynamic (token-count) shift 0.5 at 256 tokens .. 0.9 at 8192,
    sigmas stretched to end at 0.02."""
    return flow_scheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                          base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02,
                          time_shift_type="exponential")


# The released transformer's layout at test size (patch 2, 16 latent channels, rotary axes summing to
# the head width).
TRANSFORMER = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=8,
                   num_attention_heads=2, joint_attention_dim=TEXT_WIDTH, guidance_embeds=False,
                   axes_dims_rope=(2, 2, 4))


def prompt_templates():
    """The prompt templates of Qwen-Image's pipelines (set by each class's constructor, read from an
    instance without components), and the edit pipelines' per-image prefix word "Picture"."""
    import inspect

    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline, QwenImagePipeline

    texts = ["Picture 1: Picture 2: Picture 3: "]
    for cls in (QwenImagePipeline, QwenImageEditPipeline, QwenImageEditPlusPipeline):
        names = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
        texts.append(cls(**dict.fromkeys(names)).prompt_template_encode.replace("{}", ""))
    return texts


def build_qwenimage(seed: int = 0):
    """Qwen-Image (``QwenImagePipeline``): Qwen2.5-VL's last hidden state of the templated caption, the
    template's 34 system tokens dropped, the 16-channel Qwen-Image VAE, token-count shift."""
    from diffusers import QwenImagePipeline

    tokenizer = qwen_tokenizer(prompt_templates())
    transformer = random_transformer("QwenImageTransformer2DModel", seed, **TRANSFORMER)
    vae = qwen_image_vae(seed + 1)
    return QwenImagePipeline(scheduler=qwen_image_scheduler(), vae=vae,
                             text_encoder=qwen25_vl_encoder(tokenizer, seed + 2), tokenizer=tokenizer,
                             transformer=transformer)


def build_qwenimage_edit(seed: int = 0, plus: bool = False):
    """Qwen-Image-Edit (``QwenImageEditPipeline``; ``plus``: Qwen-Image-Edit-2509's
    ``QwenImageEditPlusPipeline``): Qwen-Image's parts with the ``Qwen2VLProcessor`` that puts the
    reference image into the vision-language prompt."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    pipe = build_qwenimage(seed)
    cls = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    return cls(scheduler=pipe.scheduler, vae=pipe.vae, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer,
               processor=qwen_vl_processor(pipe.tokenizer), transformer=pipe.transformer)


def build_qwenimage_edit_plus(seed: int = 0):
    return build_qwenimage_edit(seed, plus=True)


TINY = (TinyPipeline("qwenimage", build_qwenimage, dict(height=32, width=32, num_inference_steps=2)),
        TinyPipeline("qwenimage_edit", build_qwenimage_edit, dict(height=32, width=32, num_inference_steps=2)),
        TinyPipeline("qwenimage_edit_plus", build_qwenimage_edit_plus,
                     dict(height=32, width=32, num_inference_steps=2)))
