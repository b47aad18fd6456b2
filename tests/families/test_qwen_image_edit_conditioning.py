"""Qwen-Image's edit pipelines (``QwenImageEditPipeline``, ``QwenImageEditPlusPipeline``) are variants of
the qwen_image family, and their conditioning (families/qwen_image/conditioning_edit.py) feeds the
transformer what each pipeline feeds it.

* Plus, at the unit level: the pipeline is called with a caption, a reference picture at its reference
  size, a fixed noise, true CFG and the empty negative prompt, and forward pre-hooks record its
  transformer calls; the conditioning's ``encode_text`` (caption and picture), its null text (the empty
  prompt with the same picture), ``encode_images`` and ``inputs`` at the pipeline's latents and time
  give every keyword exactly (the target's then the reference's tokens, both patch grids in
  ``img_shapes``, the vision-language states and mask); ``prediction`` keeps the target's tokens only.
* Edit, end to end: a training step from a CSV (path, text, image) through the trainer's data route.

The pipelines resize references to about 1024 x 1024 pixels (a module constant / function of diffusers),
far beyond a CPU test of the tiny pipelines: the tests shrink that area in the pipelines' modules, which
the conditioning and the data route read too (``reference_size`` goes through the same function)."""

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


# QwenImageEditPipeline's inputs are checked end to end from a CSV below; here the Plus pipeline's.
@pytest.mark.parametrize("name", ["qwenimage_edit_plus"])
def test_the_edit_conditioning_feeds_the_transformer_what_the_edit_pipeline_feeds_it(name, tiny_pipeline,
                                                                                     small_areas):
    from diffusers import DiffusionPipeline
    from PIL import Image

    pipe = DiffusionPipeline.from_pretrained(tiny_pipeline(name), local_files_only=True)
    assert type(pipe).__name__ == CASES[name]
    conditioning = conditioning_of_pipeline(type(pipe).__name__)
    assert conditioning is FAMILIES["qwen_image"].conditioning_of(CASES[name])
    assert conditioning.image_input == "reference" and conditioning.null_text_per_image
    assert conditioning.max_images == 3
    assert FAMILIES["qwen_image"].conditioning_of("QwenImageEditPipeline").max_images == 1

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


def test_a_training_step_from_an_edit_csv_feeds_the_transformer_what_the_edit_pipeline_feeds_it(
        tiny_pipeline, small_areas, tmp_path):
    """The CSV route (path, text, image columns) end to end: the trainer's data reads the reference,
    resizes it by the pipeline's area rule, encodes caption, null text and reference latents; a training
    loss at the pipeline's time feeds the transformer every keyword of the pipeline's conditional and
    true-CFG calls, and its gradient reaches the transformer (the loss covers the target's tokens)."""
    from diffusers import DiffusionPipeline
    from PIL import Image

    from opendit_lite.builders.video import build_video_model
    from opendit_lite.families.tiny_pipelines import TINY_CALLS
    from opendit_lite.training.video import prepare_video_data
    from tests.families.pipeline_capture import record_differences, training_step_inputs
    from tests.pipeline_runs import pipeline_config, write_image

    folder, call = tiny_pipeline("qwenimage_edit"), TINY_CALLS["qwenimage_edit"]
    write_image(tmp_path / "target.png", 32, 32)
    write_image(tmp_path / "reference.png", 32, 64, seed=5)                      # at its reference size already
    csv = tmp_path / "edits.csv"
    csv.write_text(f"path,text,image\ntarget.png,{CAPTION},reference.png\n")
    cfg = pipeline_config(folder, str(csv), call, str(tmp_path / "results"), "model.class_dropout_prob=0.5")
    data = prepare_video_data(cfg, torch.device("cpu"))
    clip, caption, images = data.dataset[0]
    assert [tuple(image.shape) for image in images] == [(3, 32, 64)]
    x0, inputs = data.model_inputs((clip[None], [caption], [images]))             # [1, C, 1, h, w], {key: [1, ...]}
    model = build_video_model(cfg)
    denoiser = data.denoiser(model, model)
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    calls = capture(pipe, CAPTION, noise=noise, image=Image.open(tmp_path / "reference.png").convert("RGB"),
                    **call, true_cfg_scale=2.0, negative_prompt="", stop_after_step=0)
    objective = data.objective(tuple(x0.shape))

    largest, losses = {}, []
    for dropped in (False, True):
        ref = calls.unconditional(0) if dropped else calls.conditional(0)
        t = ref["timestep"].reshape(-1)[:1].float()
        latents = model_latents(pipe, ref["hidden_states"], x0.shape)
        seen, loss = training_step_inputs(model, objective, denoiser, x0, inputs, latents, t, dropped)
        losses.append(loss)
        record_differences(largest, seen, ref)
    print("\nqwenimage_edit: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    for key, diff in largest.items():
        assert diff <= (1e-5 if key in ("hidden_states", "timestep") else 0.0), f"{key} differs by {diff}"
    torch.stack(losses).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
