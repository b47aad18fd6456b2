"""Qwen-Image's edit pipelines (``QwenImageEditPipeline``, ``QwenImageEditPlusPipeline``) are variants of
the qwen_image family, and their conditioning (families/qwen_image/conditioning_edit.py) feeds the
transformer what each pipeline feeds it: the pipeline is called with a caption, a reference picture at
its reference size, a fixed noise, true CFG and the empty negative prompt, and forward pre-hooks record
its transformer calls; the conditioning's ``encode_text`` (caption and picture), its null text (the
empty prompt with the same picture), ``encode_images`` and ``inputs`` at the pipeline's latents and time
give every keyword exactly (the target's then the reference's tokens, both patch grids in
``img_shapes``, the vision-language states and mask); ``prediction`` keeps the target's tokens only.

The pipelines resize references to about 1024 x 1024 pixels (a module constant / function of diffusers),
far beyond a CPU test of the tiny pipelines: the test shrinks that area in the pipelines' modules, which
the conditioning reads too (``reference_size`` goes through the same function)."""

import numpy as np
import pytest
import torch

from opendit_lite.families import FAMILIES, conditioning_of_pipeline
from tests.families.pipeline_capture import capture, model_latents

CAPTION = "a red square moving left"
CASES = {"qwenimage_edit": "QwenImageEditPipeline", "qwenimage_edit_plus": "QwenImageEditPlusPipeline"}


@pytest.fixture
def small_areas(monkeypatch):
    """The edit pipelines' reference areas shrunk to test size (48 x 48 pixels; Plus's vision prompt 32 x 32)."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus

    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: original(48 * 48, ratio))
    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", 48 * 48)
    monkeypatch.setattr(plus, "CONDITION_IMAGE_SIZE", 32 * 32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_edit_conditioning_feeds_the_transformer_what_the_edit_pipeline_feeds_it(name, tiny_pipeline,
                                                                                     small_areas):
    from diffusers import DiffusionPipeline
    from PIL import Image

    pipe = DiffusionPipeline.from_pretrained(tiny_pipeline(name), local_files_only=True)
    assert type(pipe).__name__ == CASES[name]
    conditioning = conditioning_of_pipeline(type(pipe).__name__)
    assert conditioning is FAMILIES["qwen_image"].conditioning_of(CASES[name])
    assert conditioning.image_input == "reference" and conditioning.null_text_per_image
    assert conditioning.max_images == (1 if name == "qwenimage_edit" else 3)

    height, width = conditioning.reference_size(pipe, 40, 56)                   # the area rule, sides of 32
    assert (height, width) == (32, 64)
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))
    image = torch.from_numpy(np.array(picture)).permute(2, 0, 1).float() / 127.5 - 1   # [3, H, W] in [-1, 1]
    noise = torch.randn(1, 16, 1, 16, 16, generator=torch.Generator().manual_seed(1))   # a 32 x 32 target
    calls = capture(pipe, CAPTION, noise=noise, image=picture if name == "qwenimage_edit" else [picture],
                    height=32, width=32, num_inference_steps=2, true_cfg_scale=2.0, negative_prompt="",
                    stop_after_step=0)

    text = conditioning.encode_text(pipe, [CAPTION], [[image]])
    null = conditioning.encode_text(pipe, [""], [[image]])
    images = conditioning.encode_images(pipe, [[image]], (1, 32, 32))
    constants = conditioning.constants(pipe, pipe.transformer.config, None)
    for dropped, ref in ((False, calls.conditional(0)), (True, calls.unconditional(0))):
        x = model_latents(pipe, ref["hidden_states"], noise.shape)                # the target's tokens
        mine = conditioning.inputs(pipe.transformer.config, constants, x, ref["timestep"] * 1000,
                                   dict(null if dropped else text, **images))
        assert set(mine) == set(ref) - {"attention_kwargs", "return_dict"}
        for key, value in ref.items():
            if torch.is_tensor(value):
                assert torch.equal(mine[key], value), f"{name} dropped={dropped}: {key}"
            elif key in mine:
                assert mine[key] == value, f"{name} dropped={dropped}: {key} {mine[key]} vs {value}"
        assert ref["img_shapes"] == [[(1, 8, 8), (1, 8, 16)]]                   # target, then the reference
        out = torch.randn(1, ref["hidden_states"].shape[1], 64)
        assert torch.equal(conditioning.prediction(out, x, pipe.transformer.config, constants),
                           model_latents(pipe, out, noise.shape))               # the target's tokens only
    with pytest.raises(Exception, match="reference images per sample"):
        conditioning.encode_images(pipe, [[image] * (conditioning.max_images + 1)], (1, 32, 32))
