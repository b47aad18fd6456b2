"""HunyuanVideo 1.5 (``HunyuanVideo15Pipeline``): a training step of a run from its pipeline folder feeds
the transformer what the pipeline feeds it. The tiny pipeline is called on a caption with quoted glyph
text and a fixed noise, forward pre-hooks recording every keyword of its transformer calls (two per
step: conditional, then the empty negative prompt); the trainer's data encodes a captioned clip, and
its objective's loss is taken at the pipeline's time with the noise that puts the noisy latents where
the pipeline's are. Every input equals the pipeline's: the caption's states in the chat template with
the template cropped and its mask, ByT5's glyph states and mask, the zero image states, the latents
with their zero condition channels, the timestep's scale (and no ``timestep_r``); for a dropped
caption, the unconditional branch (one denoising step: every input's layout shows in it). The
training times are shifted as the pipeline's scheduler shifts its sampling times.

Run with -s to see the largest difference of each input."""

import numpy as np
import pytest
import torch

from opendit_lite.builders.video import build_video_model
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.training.video import prepare_video_data
from tests.families.pipeline_capture import capture, model_latents, record_differences, training_step_inputs
from tests.pipeline_runs import pipeline_config, write_clip, write_csv

CAPTION = 'a red square with the sign "OPEN" moving left'


@pytest.fixture(scope="module")
def glyph_clip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glyph")
    write_clip(folder / "clip.mp4", 12, 40, 48)
    return write_csv(folder, [("clip.mp4", CAPTION)], "clips.csv")


def test_a_training_step_feeds_the_transformer_what_hunyuan_video15_feeds_it(tiny_pipeline, glyph_clip, tmp_path):
    from diffusers import DiffusionPipeline

    folder, call = tiny_pipeline("hunyuanvideo15"), TINY_CALLS["hunyuanvideo15"]
    cfg = pipeline_config(folder, glyph_clip, call, str(tmp_path), "model.class_dropout_prob=0.5")
    data = prepare_video_data(cfg, torch.device("cpu"))
    clip, caption = data.dataset[0]
    x0, text = data.model_inputs((clip[None], [caption]))                         # [1, C, T, h, w], {key: [1, ...]}
    assert text["encoder_attention_mask_2"].sum() > 0, "the caption's glyph text reaches ByT5"
    model = build_video_model(cfg)
    denoiser = data.denoiser(model, model)
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    calls = capture(pipe, CAPTION, noise=noise, **dict(call, num_inference_steps=1))  # one step: both branches
    objective = data.objective(tuple(x0.shape))

    largest, losses = {}, []
    for step in sorted({c.step for c in calls.calls}):
        for dropped in (False, True):
            ref = calls.unconditional(step) if dropped else calls.conditional(step)
            t = (ref["timestep"].reshape(-1)[:1].double() / 1000).float()
            latents = model_latents(pipe, ref["hidden_states"][:, :x0.shape[1]], x0.shape)
            seen, loss = training_step_inputs(model, objective, denoiser, x0, text, latents, t, dropped)
            losses.append(loss)
            record_differences(largest, seen, ref)
    print("\nhunyuanvideo15: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    for key, diff in largest.items():
        tolerance = {"hidden_states": 1e-5, "timestep": 1e-2}.get(key, 0.0)  # the noise solved for in fp32
        assert diff <= tolerance, f"{key} differs by {diff}"
    torch.stack(losses).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())

    # the unconditional branch is the empty caption: no glyph text
    assert calls.unconditional(0)["encoder_attention_mask_2"].sum() == 0
    # the training times are shifted as the scheduler shifts the pipeline's sampling grid (1, 0.75, 0.5, 0.25)
    pipe.scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, 5)[:-1])
    assert objective.shift == pipe.scheduler.config.shift
    shifted = objective.shift_time(torch.tensor([1.0, 0.75, 0.5, 0.25], dtype=torch.float64))
    assert torch.allclose(shifted, pipe.scheduler.sigmas[:4].double(), atol=1e-6)


def test_the_parameters_built_frozen_are_those_no_step_gives_a_gradient(tiny_pipeline):
    """The last block's text-stream output projection and feed-forward are in no step's graph (a caption
    without quoted text, as here, leaves no other parameter out): exactly what the adapter declares
    unused (the capability ``unused_parameters``) and ``parallelize`` freezes, so DDP sees a gradient for every
    trained parameter."""
    from diffusers import HunyuanVideo15Transformer3DModel

    from opendit_lite.families import family_adapter
    from opendit_lite.models.capabilities import unused_parameters
    from opendit_lite.parallelization import freeze_unused_parameters

    model = HunyuanVideo15Transformer3DModel.from_pretrained(tiny_pipeline("hunyuanvideo15"), subfolder="transformer")
    adapter = family_adapter(model)
    g = torch.Generator().manual_seed(0)
    x, states = torch.randn(2, 4, 2, 4, 4, generator=g), torch.randn(2, 6, 16, generator=g)
    mask = torch.arange(6)[None] < torch.tensor([6, 4])[:, None]
    adapter.forward(model, model.config, x, torch.tensor([300.0, 800.0]), states, mask, None).square().mean().backward()
    without = {name for name, p in model.named_parameters() if p.grad is None}
    assert without == set(unused_parameters(model))
    freeze_unused_parameters(model)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen == without
