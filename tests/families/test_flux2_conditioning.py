"""A training step of a run from a FLUX.2 [dev] pipeline folder (``model.pipeline``, ``data.type: csv``)
feeds the transformer what ``Flux2Pipeline`` feeds it (the tiny random pipeline of the release's
layout, built once per test run): the pipeline is called on a caption with a fixed noise and forward
pre-hooks record every keyword of its transformer calls; the trainer's data encodes a captioned image
with the same caption, and its objective's training loss is taken at the pipeline's time with the noise
that puts the noisy latents where the pipeline's are. Every input (the Mistral states of layers 10, 20
and 30 stacked, 512 tokens with their padding, text and image ids, guidance, the timestep's scale)
equals the pipeline's; a dropped caption sees what the pipeline feeds for an empty prompt (it has no
negative prompt). The training shift is the one the pipeline's scheduler samples with at its default
step count (FLUX.2's empirical mu), the latents route (scripts/extract_latents.py --pipeline)
stores exactly what the CSV route trains on, those latents are the pipeline's own VAE step, and the
family's adapter (a run from ``model.path``) gives the transformer the same inputs.

Run with -s to see the largest difference of each input."""

import math

import torch

from opendit_lite.builders.video import build_video_model
from opendit_lite.data.latent_shards import load_null_text_shards
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.training.video import prepare_video_data
from tests.families.pipeline_capture import capture, model_latents, record_differences, training_step_inputs
from tests.families.test_pipeline_conditioning import CAPTION
from tests.pipeline_runs import extract_script, pipeline_config, write_csv, write_image


def test_a_flux2_training_step_feeds_the_transformer_what_flux2pipeline_feeds_it(tiny_pipeline, tmp_path):
    from diffusers import DiffusionPipeline

    folder, call = tiny_pipeline("flux2"), TINY_CALLS["flux2"]
    write_image(tmp_path / "image.png", 40, 48)
    csv = write_csv(tmp_path, [("image.png", CAPTION)])
    cfg = pipeline_config(folder, csv, call, str(tmp_path / "run"), "model.class_dropout_prob=0.5")
    data = prepare_video_data(cfg, torch.device("cpu"))
    clip, caption = data.dataset[0]
    x0, text = data.model_inputs((clip[None], [caption]))                         # [1, 16, 1, 8, 8], {key: [1, ...]}
    assert x0.shape == (1, 16, 1, 8, 8) and text["encoder_hidden_states"].shape == (1, 512, 24)
    model = build_video_model(cfg)
    denoiser = data.denoiser(model, model)
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    runs = {False: capture(pipe, CAPTION, noise=noise, **call), True: capture(pipe, "", noise=noise, **call)}
    objective = data.objective(tuple(x0.shape))

    largest, losses = {}, []
    for dropped, calls in runs.items():
        for step in sorted({c.step for c in calls.calls}):
            ref = calls.conditional(step)
            t = ref["timestep"].reshape(-1)[:1].float()                            # the pipeline passes sigma
            latents = model_latents(pipe, ref["hidden_states"], x0.shape)
            seen, loss = training_step_inputs(model, objective, denoiser, x0, text, latents, t, dropped)
            losses.append(loss)
            record_differences(largest, seen, ref)
    print("\nflux2 (Flux2Pipeline): " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    assert set(largest) == {"hidden_states", "timestep", "guidance", "encoder_hidden_states", "txt_ids", "img_ids"}
    for key, diff in largest.items():
        assert diff <= (1e-5 if key in ("hidden_states", "timestep") else 0.0), f"{key} differs by {diff}"
    torch.stack(losses).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())

    # the family's adapter (a run from model.path) feeds the same inputs as the pipeline's conditioning
    from opendit_lite.families import FAMILIES

    t = torch.tensor([700.0])
    with torch.no_grad():
        via_adapter = FAMILIES["flux2"].adapter.forward(model, model.config, x0, t, text["encoder_hidden_states"],
                                                        None, None)
        torch.testing.assert_close(via_adapter, denoiser(x0, t, **text), rtol=0, atol=1e-6)

    # the shift: the pipeline's scheduler at its default 50 steps samples sigma' = s sigma / (1 + (s - 1) sigma)
    capture(pipe, CAPTION, noise=noise, stop_after_step=0, height=call["height"], width=call["width"])
    sigmas = torch.linspace(1.0, 1 / 50, 50, dtype=torch.float64)
    s = objective.shift if hasattr(objective, "shift") else data.recipe.shift
    assert torch.allclose(pipe.scheduler.sigmas[:-1].double(), s * sigmas / (1 + (s - 1) * sigmas), atol=1e-6)
    assert not math.isclose(s, pipe.scheduler.config.shift)  # not the scheduler's static shift

    # the latents route stores what the CSV route trains on
    out = str(tmp_path / "latents")
    assert extract_script().main(["--pipeline", folder, "--csv", csv, "--num-frames", "1", "--height", "32",
                                  "--width", "32", "--num-workers", "0", "--output", out]) == 1
    latents_cfg = pipeline_config(folder, csv, call, str(tmp_path / "run2"), "data.type=latents", f"data.path={out}")
    route = prepare_video_data(latents_cfg, torch.device("cpu"))
    latents, inputs, _ = route.dataset[0]                                        # [C, 1, h, w], {key: [...]}
    stored_x0, stored_text = route.model_inputs((latents[None], {k: v[None] for k, v in inputs.items()}, None))
    assert torch.allclose(stored_x0, x0, atol=1e-6)
    assert torch.equal(stored_text["encoder_hidden_states"], text["encoder_hidden_states"])
    null = load_null_text_shards(out)["encoder_hidden_states"]
    assert torch.equal(null, runs[True].conditional(0)["encoder_hidden_states"])
    # ... and the latents are the pipeline's own VAE step (its reference-image encoder: mode, 2x2 patches, BatchNorm)
    assert torch.allclose(pipe._encode_vae_image(clip[:, 0][None], generator=None), x0[:, :, 0], atol=1e-5)


def test_flux2_captions_are_encoded_from_the_pipeline_folder_only(tiny_pipeline):
    """``extract_latents.py --family flux2`` cannot encode captions: the transformer reads Mistral's states
    as the pipeline prompts it (chat template, three stacked layers), which only the pipeline computes."""
    import os

    import pytest

    from opendit_lite.encoders.family_encoders import load_family_text_encoder
    from opendit_lite.errors import ConfigError
    from opendit_lite.families import FAMILIES

    folder = tiny_pipeline("flux2")
    with pytest.raises(ConfigError, match="only its pipeline.s own encode_prompt gives"):
        load_family_text_encoder(FAMILIES["flux2"].encoding, os.path.join(folder, "text_encoder"), "the text encoder",
                                 tokenizer_path=os.path.join(folder, "tokenizer"))

