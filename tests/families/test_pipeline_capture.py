"""The tiny random pipelines of the seven released layouts load with ``DiffusionPipeline.from_pretrained``
(their tokenizers with their own classes too), run, and the capture harness records what each
pipeline feeds its transformer(s): the keywords the release's pipeline passes, the caption's token
counts and widths, the guidance and timestep scales, the fixed noise as the first step's input,
and Wan 2.2's two experts on either side of the boundary."""

import json
import os

import pytest
import torch

from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.families.pipeline_capture import capture, pipeline_latents

CAPTION = "a red square moving left"

# family -> (pipeline class, the keywords its transformer gets, caption tokens, CFG layout):
# "calls": two calls per step (conditional first), "batch": one call on [unconditional, conditional],
# None: no unconditional branch at the pipeline's defaults.
EXPECTED = {
    "wan": ("WanPipeline", {"hidden_states", "timestep", "encoder_hidden_states", "attention_kwargs", "return_dict"},
            512, "calls"),
    "wan22": ("WanPipeline", {"hidden_states", "timestep", "encoder_hidden_states", "attention_kwargs",
                              "return_dict"}, 512, "calls"),
    "hunyuanvideo": ("HunyuanVideoPipeline", {"hidden_states", "timestep", "encoder_hidden_states",
                                              "encoder_attention_mask", "pooled_projections", "guidance",
                                              "attention_kwargs", "return_dict"}, 256, None),
    "cogvideox": ("CogVideoXPipeline", {"hidden_states", "encoder_hidden_states", "timestep", "image_rotary_emb",
                                        "attention_kwargs", "return_dict"}, 226, "batch"),
    "ltx": ("LTXPipeline", {"hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask",
                            "num_frames", "height", "width", "rope_interpolation_scale", "attention_kwargs",
                            "return_dict"}, 128, "batch"),
    "flux": ("FluxPipeline", {"hidden_states", "timestep", "guidance", "pooled_projections", "encoder_hidden_states",
                              "txt_ids", "img_ids", "joint_attention_kwargs", "return_dict"}, 512, None),
    "sd3": ("StableDiffusion3Pipeline", {"hidden_states", "timestep", "encoder_hidden_states", "pooled_projections",
                                         "joint_attention_kwargs", "return_dict"}, 77 + 256, "batch"),
}


def _load(folder):
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(folder, local_files_only=True)


def _noise(pipe, family: str, seed: int = 3) -> torch.Tensor:
    """Latent noise [1, C, T, h, w] of the family's tiny call size."""
    call = TINY_CALLS[family]
    vae = pipe.vae
    if family in ("flux", "sd3"):
        channels, frames, down = vae.config.latent_channels, 1, 2 ** (len(vae.config.block_out_channels) - 1)
    else:
        channels = pipe.transformer.config.in_channels
        down = getattr(pipe, "vae_scale_factor_spatial", None) or pipe.vae_spatial_compression_ratio
        temporal = getattr(pipe, "vae_scale_factor_temporal", None) or pipe.vae_temporal_compression_ratio
        frames = (call["num_frames"] - 1) // temporal + 1
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, channels, frames, call["height"] // down, call["width"] // down, generator=g)


@pytest.fixture(scope="module")
def run(tiny_pipeline):
    """family -> (pipeline, noise, capture of one run at the tiny call size), once per module."""
    runs = {}

    def get(family: str):
        if family not in runs:
            pipe = _load(tiny_pipeline(family))
            noise = _noise(pipe, family)
            runs[family] = pipe, noise, capture(pipe, CAPTION, noise=noise, **TINY_CALLS[family])
        return runs[family]

    return get


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_tiny_pipeline_loads_and_capture_records_the_transformer_inputs(run, family):
    pipe, noise, calls = run(family)
    name, keywords, tokens, layout = EXPECTED[family]
    assert type(pipe).__name__ == name

    steps = TINY_CALLS[family]["num_inference_steps"]
    assert sorted({c.step for c in calls.calls}) == list(range(steps))
    for call in calls.calls:
        assert set(call.kwargs) == keywords, f"{family}: the transformer got {sorted(call.kwargs)}"
    per_step = len(calls.at(0))
    assert per_step == (2 if layout == "calls" else 1)

    first = calls.conditional(step=0)
    assert first["encoder_hidden_states"].shape[:2] == (1, tokens)
    # Every flow pipeline starts at sigma 1 (CogVideoX's DDIM scales by init_noise_sigma = 1): the noise.
    torch.testing.assert_close(first["hidden_states"], pipeline_latents(pipe, noise), rtol=0, atol=0)
    if layout is not None:
        second = calls.unconditional(step=0)
        assert second["encoder_hidden_states"].shape == first["encoder_hidden_states"].shape
        assert not torch.equal(second["encoder_hidden_states"], first["encoder_hidden_states"])


def test_flux_feeds_clip_pooled_text_guidance_and_ids(run):
    pipe, _, calls = run("flux")
    first = calls.conditional(0)
    assert first["guidance"].tolist() == [3.5]                                  # __call__'s default
    assert first["timestep"].tolist() == [1.0]                                  # sigma, not x 1000
    assert first["pooled_projections"].shape == (1, pipe.text_encoder.config.hidden_size)
    assert torch.equal(first["txt_ids"], torch.zeros(512, 3))
    side = TINY_CALLS["flux"]["height"] // pipe.vae_scale_factor // 2
    assert first["img_ids"].shape == (side * side, 3)


def test_hunyuanvideo_feeds_a_float_mask_and_guidance_times_1000(run):
    first = run("hunyuanvideo")[2].conditional(0)
    assert first["guidance"].tolist() == [6000.0]
    mask = first["encoder_attention_mask"]
    assert mask.dtype == torch.float32
    # The template's 95 tokens are cropped: the caption's 5 words and <|eot_id|> remain.
    assert mask.sum().item() == len(CAPTION.split()) + 1


def test_sd3_joins_two_clips_and_t5(run):
    pipe, _, calls = run("sd3")
    first = calls.conditional(0)
    pooled = pipe.text_encoder.config.projection_dim + pipe.text_encoder_2.config.projection_dim
    assert first["pooled_projections"].shape == (1, pooled)
    clip_width = pipe.text_encoder.config.hidden_size + pipe.text_encoder_2.config.hidden_size
    assert torch.count_nonzero(first["encoder_hidden_states"][:, :77, clip_width:]) == 0  # CLIP states padded


def test_wan22_sends_each_step_to_the_expert_of_its_noise_level(tiny_pipeline, run):
    with open(os.path.join(tiny_pipeline("wan22"), "model_index.json")) as f:
        boundary = json.load(f)["boundary_ratio"] * 1000
    calls = run("wan22")[2].calls
    high = [c.kwargs["timestep"].item() for c in calls if c.component == "transformer"]
    low = [c.kwargs["timestep"].item() for c in calls if c.component == "transformer_2"]
    assert high and low
    assert min(high) >= boundary > max(low)


@pytest.mark.parametrize("family", ["hunyuanvideo", "sd3"])
def test_tokenizers_load_with_their_own_classes(tiny_pipeline, run, family):
    import transformers

    folder = tiny_pipeline(family)
    pipe = run(family)[0]
    with open(os.path.join(folder, "model_index.json")) as f:
        index = json.load(f)
    for slot in ("tokenizer", "tokenizer_2", "tokenizer_3"):
        if not index.get(slot) or index[slot][1] is None:
            continue
        path = os.path.join(folder, slot)
        for cls in (getattr(transformers, index[slot][1]), transformers.AutoTokenizer):
            ids = cls.from_pretrained(path, local_files_only=True)(CAPTION).input_ids
            assert ids == getattr(pipe, slot)(CAPTION).input_ids


def test_capture_can_stop_after_a_step(run):
    pipe = run("flux")[0]
    calls = capture(pipe, CAPTION, stop_after_step=0, **TINY_CALLS["flux"])
    assert [c.step for c in calls.calls] == [0]
    with pytest.raises(KeyError, match="without guidance"):
        calls.unconditional(0)
