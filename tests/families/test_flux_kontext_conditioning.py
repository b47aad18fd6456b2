"""FLUX.1 Kontext (``FluxKontextPipeline``, a variant of the Flux family): for the same caption, reference
image, noise and time, the training inputs (``flux/conditioning_kontext.py`` through ``PipelineDenoiser``)
equal every keyword the pipeline's ``__call__`` passes its transformer, at each step, for the caption and
for a dropped caption (what the pipeline feeds its unconditional branch with true CFG and the empty negative
prompt: the same reference). The reference is resized as ``__call__`` resizes it (``reference_size`` against
the size the pipeline asks its image processor for), and the prediction covers the target's tokens only.

The pipeline's table of preferred resolutions (about one megapixel each) is swapped for a small one read by
both sides alike, so that the tiny transformer sees tens of reference tokens, not 65 thousand.
"""

import numpy as np
import pytest
import torch
from PIL import Image

from opendit_lite.errors import ConfigError
from opendit_lite.families import FAMILIES, conditioning_of_pipeline, family_of_pipeline
from opendit_lite.families.flux.conditioning_kontext import CONDITIONING, REFERENCE_IDS, REFERENCE_LATENTS
from opendit_lite.families.pipeline_denoiser import PipelineDenoiser
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.families.pipeline_capture import capture, model_latents

CAPTION = "a red square moving left"
IGNORED = {"joint_attention_kwargs", "return_dict"}
# The reference's VAE latents: the pipeline's preprocessed image is channels-last, the data's [3, H, W] image
# taken from it is not; the VAE's convolutions round differently by layout (4e-7 seen). Everything else: exact.
TOLERANCE = {"hidden_states": 1e-5}
# (width, height) as diffusers lists them; multiples of 4 (the tiny VAE's 2 x the packing's 2) but (30, 30) and
# (42, 22), which the pipeline floors to 28 x 28 and 40 x 20.
SMALL_RESOLUTIONS = [(24, 40), (30, 30), (42, 22)]


@pytest.fixture(scope="module")
def pipe(tiny_pipeline):
    """The tiny Flux dev parts (the suite's saved ``flux`` folder) in ``FluxKontextPipeline``: what
    ``flux_kontext`` builds, loaded in a tenth of a second rather than built in four."""
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline.from_pretrained(tiny_pipeline("flux"), local_files_only=True)


@pytest.fixture(autouse=True)
def small_resolutions(monkeypatch):
    from diffusers.pipelines.flux import pipeline_flux_kontext

    monkeypatch.setattr(pipeline_flux_kontext, "PREFERRED_KONTEXT_RESOLUTIONS", SMALL_RESOLUTIONS)


def _picture(height: int, width: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


class _Resized(Exception):
    pass


def _pipeline_reference_size(pipe, picture):
    """The (height, width) ``__call__`` resizes ``picture`` to (stopped at its image processor's resize)."""
    processor = pipe.image_processor
    original = processor.resize

    def resize(image, height, width, *args, **kwargs):
        raise _Resized(height, width)

    processor.resize = resize
    try:
        pipe(prompt=CAPTION, image=picture, output_type="latent", **TINY_CALLS["flux_kontext"])
    except _Resized as stop:
        return stop.args
    finally:
        processor.resize = original
    raise AssertionError("the pipeline did not resize the reference")


def test_kontext_is_a_variant_of_the_flux_family(pipe):
    assert family_of_pipeline("FluxKontextPipeline") is FAMILIES["flux"]
    assert conditioning_of_pipeline("FluxKontextPipeline") is CONDITIONING
    assert CONDITIONING.image_input == "reference" and CONDITIONING.max_images == 1
    for height, width in ((50, 30), (20, 36), (33, 35)):
        assert CONDITIONING.reference_size(pipe, height, width) == _pipeline_reference_size(
            pipe, _picture(height, width)), (height, width)
    assert [CONDITIONING.reference_size(pipe, h, w) for h, w in ((50, 30), (20, 36), (33, 35))] == \
        [(40, 24), (20, 40), (28, 28)]
    with pytest.raises(ConfigError, match="exactly one reference image"):
        CONDITIONING.encode_images(pipe, [[]], (1, 32, 32))
    references = [[torch.zeros(3, 40, 24)], [torch.zeros(3, 28, 28)]]
    with pytest.raises(ConfigError, match="different sizes"):
        CONDITIONING.encode_images(pipe, references, (1, 32, 32))


def test_training_inputs_equal_the_pipelines_with_the_reference(pipe):
    picture = _picture(50, 30)
    height, width = CONDITIONING.reference_size(pipe, 50, 30)
    # the reference as the data gives it: resized as the pipeline resizes it, [3, H, W] in [-1, 1]
    reference = pipe.image_processor.preprocess(pipe.image_processor.resize(picture, height, width), height, width)[0]
    noise = torch.randn(1, 16, 1, 16, 16, generator=torch.Generator().manual_seed(1))        # a 32 x 32 target
    calls = capture(pipe, CAPTION, noise=noise, image=picture, true_cfg_scale=2.0, negative_prompt="",
                    **TINY_CALLS["flux_kontext"])
    timesteps = pipe.scheduler.timesteps

    with torch.no_grad():  # as the trainer encodes (T5 runs other kernels under autograd: 4e-6 apart)
        images = CONDITIONING.encode_images(pipe, [[reference]], (1, 32, 32))
        text, null = CONDITIONING.encode_text(pipe, [CAPTION]), CONDITIONING.encode_text(pipe, [""])
    assert images[REFERENCE_LATENTS].shape == (1, (height // 4) * (width // 4), 64)
    assert (images[REFERENCE_IDS][..., 0] == 1).all()
    config = pipe.transformer.config
    constants = CONDITIONING.constants(pipe, config, None)
    assert constants["guidance"] == 3.5  # __call__'s guidance_scale default in diffusers 0.42.1
    denoiser = PipelineDenoiser(CONDITIONING, FAMILIES["flux"].adapter, pipe.transformer, config, constants, null)
    steps, largest = sorted({c.step for c in calls.calls}), 0.0
    assert steps == [0, 1] and all(len(calls.at(s)) == 2 for s in steps)
    for step in steps:
        for dropped in (False, True):
            ref = calls.unconditional(step) if dropped else calls.conditional(step)
            x = model_latents(pipe, ref["hidden_states"], noise.shape)                       # [1, 16, 1, 16, 16]
            mine = denoiser.inputs(x, timesteps[step].expand(1), drop=torch.tensor([dropped]), **text, **images)
            assert set(mine) == set(ref) - IGNORED, f"{sorted(mine)} vs {sorted(ref)}"
            for key in sorted(mine):
                if not torch.is_tensor(ref[key]):
                    assert mine[key] == ref[key], f"step {step}, dropped {dropped}: {key}"
                    continue
                diff = (mine[key].double() - ref[key].double()).abs().max().item()
                largest = max(largest, diff) if key == "hidden_states" else largest
                assert diff <= TOLERANCE.get(key, 0.0), f"step {step}, dropped {dropped}: {key} differs by {diff}"
    print(f"\nhidden_states (the reference's latents) differ by at most {largest:.2g}")
    # the prediction: the target's 64 tokens of the output, unpacked as the pipeline unpacks its latents
    with torch.no_grad():
        out = pipe.transformer(**mine, return_dict=False)[0]                                 # [1, 64 + 60, 64]
        prediction = denoiser(x, timesteps[1].expand(1), drop=torch.tensor([True]), **text, **images)
    assert out.shape[1] == 64 + images[REFERENCE_LATENTS].shape[1]
    assert torch.equal(prediction, pipe._unpack_latents(out[:, :64], 32, 32, pipe.vae_scale_factor).unsqueeze(2))


def test_the_latents_route_refuses_references_of_different_sizes_in_one_batch():
    """Extracted samples keep their own reference latents; a batch of two sizes is refused by name."""
    from opendit_lite.data.video_latents import collate_pipeline_latents

    def item(index, tokens):
        return index, (torch.zeros(16, 1, 4, 4), {REFERENCE_LATENTS: torch.zeros(tokens, 64),
                                                  REFERENCE_IDS: torch.zeros(tokens, 3)}, "caption")

    indices, (latents, inputs, captions) = collate_pipeline_latents([item(0, 60), item(1, 60)])
    assert latents.shape == (2, 16, 1, 4, 4) and inputs[REFERENCE_LATENTS].shape == (2, 60, 64)
    with pytest.raises(ConfigError, match="'reference_latents' of the samples of one batch comes in different"):
        collate_pipeline_latents([item(0, 60), item(1, 50)])
