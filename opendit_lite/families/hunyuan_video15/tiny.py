"""The tiny random pipelines of HunyuanVideo 1.5's released layouts, for tests and
``scripts/make_tiny_pipeline.py``: text-to-video (``hunyuanvideo15``, ``HunyuanVideo15Pipeline``) and
image-to-video (``hunyuanvideo15_i2v``, ``HunyuanVideo15ImageToVideoPipeline``).

Both hold Qwen2.5-VL's text model behind a Qwen2 tokenizer with Qwen's chat template (the pipeline
wraps every caption in it and crops the first 108 tokens), ByT5 (a ``T5EncoderModel`` behind the
byte-level ``ByT5Tokenizer``) for the quoted glyph text, the transformer (65 input channels in the
release: latents, condition latents, condition mask), ``AutoencoderKLHunyuanVideo15`` (the release's
scaling 1.03682), classifier-free guidance as a ``guider`` component and a flow scheduler with the
480p release's shift 5. The image-to-video pipeline adds SigLIP's vision tower and its image
processor. Every text encoder is built from its transformers config class, every tokenizer from the
``tokenizers`` library, offline.
"""

import torch

from ..tiny_parts import CAPTION_WORDS, TinyPipeline, diffusers_model, flow_scheduler, random_transformer, t5_encoder

WIDTH = 16  # text widths (Qwen2.5-VL, ByT5) and SigLIP's
# Qwen2's chat format: each message as <|im_start|>role\ncontent<|im_end|>\n, then the assistant's header.
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def qwen_tokenizer(texts=()):
    """A Qwen2 tokenizer (transformers' ``Qwen2Tokenizer``: byte-level BPE over Qwen's split, padding
    with ``<|endoftext|>`` on the right) whose merges hold ``CAPTION_WORDS`` and the words of ``texts``
    whole, with Qwen's chat template. The BPE is trained by the ``tokenizers`` library."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1 << 20, special_tokens=list(_QWEN_SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([" ".join(CAPTION_WORDS), *texts], trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, additional_special_tokens=list(_QWEN_SPECIAL[1:]))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "right"
    return tokenizer


def qwen_text_encoder(tokenizer, width: int = WIDTH):
    """Qwen2.5-VL's text model (``Qwen2_5_VLTextModel``) with three layers (the pipeline reads the
    third to last hidden state), ``width`` wide."""
    import transformers

    config = transformers.Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return transformers.Qwen2_5_VLTextModel(config).eval()


def byt5_parts(width: int = WIDTH):
    """ByT5's tokenizer (bytes; nothing to train) and a one-layer T5 encoder ``width`` wide."""
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer()
    return tokenizer, t5_encoder(tokenizer, width)


def siglip_parts(width: int = WIDTH):
    """SigLIP's vision tower (16x16 images in 8x8 patches: 4 tokens, ``width`` wide) and its image processor."""
    import transformers

    config = transformers.SiglipVisionConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=16, patch_size=8)
    processor = transformers.SiglipImageProcessor(size={"height": 16, "width": 16})
    return transformers.SiglipVisionModel(config).eval(), processor


def _components(seed: int, image_embed_dim: int) -> dict:
    from diffusers import ClassifierFreeGuidance
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import HunyuanVideo15Pipeline

    system = HunyuanVideo15Pipeline._get_mllm_prompt_embeds.__defaults__[2]  # the pipeline's system message
    tokenizer = qwen_tokenizer(texts=[system, "system", "user", "assistant"])
    tokenizer_2, text_encoder_2 = byt5_parts()
    latent = 4
    transformer = random_transformer(
        "HunyuanVideo15Transformer3DModel", seed, in_channels=2 * latent + 1, out_channels=latent,
        num_attention_heads=2, attention_head_dim=8, num_layers=2, num_refiner_layers=1, patch_size=1,
        patch_size_t=1, text_embed_dim=WIDTH, text_embed_2_dim=WIDTH, image_embed_dim=image_embed_dim,
        rope_axes_dim=(2, 2, 4), target_size=32)
    vae = diffusers_model("AutoencoderKLHunyuanVideo15", seed + 1, latent_channels=latent,
                          block_out_channels=(8, 8, 8), layers_per_block=1, spatial_compression_ratio=4,
                          temporal_compression_ratio=4, scaling_factor=1.03682)
    torch.manual_seed(seed + 2)
    return dict(tokenizer=tokenizer, text_encoder=qwen_text_encoder(tokenizer), tokenizer_2=tokenizer_2,
                text_encoder_2=text_encoder_2, transformer=transformer, vae=vae.eval(),
                scheduler=flow_scheduler(shift=5.0), guider=ClassifierFreeGuidance(guidance_scale=6.0))


def build_hunyuanvideo15(seed: int = 0):
    """HunyuanVideo 1.5 text-to-video (``HunyuanVideo15Pipeline``)."""
    from diffusers import HunyuanVideo15Pipeline

    return HunyuanVideo15Pipeline(**_components(seed, image_embed_dim=WIDTH))


def build_hunyuanvideo15_i2v(seed: int = 0):
    """HunyuanVideo 1.5 image-to-video (``HunyuanVideo15ImageToVideoPipeline``): the same parts and SigLIP."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    image_encoder, feature_extractor = siglip_parts()
    return HunyuanVideo15ImageToVideoPipeline(image_encoder=image_encoder, feature_extractor=feature_extractor,
                                              **_components(seed, image_embed_dim=WIDTH))


TINY = (TinyPipeline("hunyuanvideo15", build_hunyuanvideo15,
                     dict(height=32, width=32, num_frames=5, num_inference_steps=2)),
        TinyPipeline("hunyuanvideo15_i2v", build_hunyuanvideo15_i2v, dict(num_frames=5, num_inference_steps=2)))
