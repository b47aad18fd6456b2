"""The tiny random pipeline of FLUX.2 [dev]'s released layout (``flux2``), for tests and
``scripts/make_tiny_pipeline.py``: the text-to-image ``Flux2Pipeline`` with its release's component
classes (``Mistral3ForConditionalGeneration`` with a Pixtral vision tower and its
``PixtralProcessor``, ``AutoencoderKLFlux2`` with its latent BatchNorm, the guidance-distilled
``Flux2Transformer2DModel``) at test size."""

import torch

from ..tiny_parts import (
    _LLAMA3_SPLIT,
    CAPTION_WORDS,
    TinyPipeline,
    byte_level_bpe,
    diffusers_model,
    flow_scheduler,
    random_transformer,
)

# Mistral's special tokens (Mistral Small 3.1's chat and image markers); <pad> last.
_MISTRAL_SPECIAL = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]",
                    "[IMG_BREAK]", "[IMG_END]", "<pad>")
# Mistral Small 3.1's chat layout for the messages ``Flux2Pipeline`` formats (a system turn, user turns whose
# content is a list of text parts): [SYSTEM_PROMPT]..[/SYSTEM_PROMPT][INST]..[/INST] after <s>.
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set text = message['content'] if message['content'] is string else message['content'] "
    "| selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{{ text }}[/INST]"
    "{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}")
# The text encoder's layers: Flux2Pipeline stacks hidden states 10, 20 and 30 (the release's Mistral has 40).
_TEXT_LAYERS = 30


def mistral_processor(texts=()):
    """A ``PixtralProcessor`` (the release's tokenizer class) over a byte-level BPE that holds
    ``CAPTION_WORDS`` and the words of ``texts`` whole, with Mistral's chat and image tokens, left
    padding with ``<pad>`` and the chat template above."""
    from transformers import PixtralImageProcessor, PixtralProcessor, PreTrainedTokenizerFast

    tokenizer = byte_level_bpe(_LLAMA3_SPLIT, _MISTRAL_SPECIAL, [" ".join(CAPTION_WORDS), *texts])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", padding_side="left", model_max_length=131072)
    return PixtralProcessor(image_processor=PixtralImageProcessor(patch_size=8, size={"longest_edge": 32}),
                            tokenizer=fast, patch_size=8, spatial_merge_size=2, chat_template=_CHAT_TEMPLATE,
                            image_token="[IMG]", image_break_token="[IMG_BREAK]", image_end_token="[IMG_END]")


def mistral3_encoder(processor, width: int):
    """A ``Mistral3ForConditionalGeneration`` (Mistral Small 3.1's class): a Mistral language model of
    ``_TEXT_LAYERS`` layers, ``width`` wide, and a one-layer Pixtral vision tower."""
    import transformers

    tokenizer = processor.tokenizer
    text = transformers.MistralConfig(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=_TEXT_LAYERS,
        num_attention_heads=2, num_key_value_heads=1, head_dim=width // 2, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    vision = transformers.PixtralVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                              num_attention_heads=2, head_dim=4, image_size=32, patch_size=8)
    config = transformers.Mistral3Config(vision_config=vision, text_config=text, spatial_merge_size=2,
                                         image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"))
    return transformers.Mistral3ForConditionalGeneration(config).eval()


def flux2_vae(seed: int):
    """``AutoencoderKLFlux2`` (2x here, 8x in the release) with 4 latent channels and random BatchNorm
    statistics over its 2x2 patches (16 channels), so that the pipeline's normalisation matters."""
    vae = diffusers_model("AutoencoderKLFlux2", seed, block_out_channels=(8, 8),
                          down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                          layers_per_block=1, latent_channels=4, norm_num_groups=4)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.randn(vae.bn.num_features, generator=g) * 0.1)
        vae.bn.running_var.copy_(torch.rand(vae.bn.num_features, generator=g) + 0.5)
    return vae.eval()


def build_flux2(seed: int = 0):
    """FLUX.2 [dev] (``Flux2Pipeline``): Mistral 3 (8 wide, 30 layers: the transformer reads layers 10, 20
    and 30 stacked, 24 wide), 512 caption tokens, the guidance-distilled transformer on the VAE's 16
    patch channels, the scheduler's dynamic shift (the pipeline gives it its empirical mu)."""
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    processor = mistral_processor([SYSTEM_MESSAGE])
    transformer = random_transformer(
        "Flux2Transformer2DModel", seed, patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=24, timestep_guidance_channels=16,
        axes_dims_rope=(2, 2, 2, 2), guidance_embeds=True)
    scheduler = flow_scheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                               base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")
    vae = flux2_vae(seed + 1)
    torch.manual_seed(seed + 2)
    return Flux2Pipeline(scheduler=scheduler, vae=vae, text_encoder=mistral3_encoder(processor, 8), tokenizer=processor,
                         transformer=transformer)


TINY = (TinyPipeline("flux2", build_flux2, dict(height=32, width=32, num_inference_steps=2)),)
