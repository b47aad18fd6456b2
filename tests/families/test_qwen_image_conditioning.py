"""A training step of a run from a Qwen-Image pipeline folder (``model.pipeline``, ``data.type: csv``)
feeds the transformer what ``QwenImagePipeline`` feeds it (the form of test_pipeline_conditioning.py):
the pipeline is called on a caption with a fixed noise, true CFG on and the empty negative prompt, and
forward pre-hooks record every keyword of every transformer call; the trainer's data encodes a
captioned image with the same caption, and its objective's loss is taken at the pipeline's time with
the noise that puts the noisy latents where the pipeline's are. Every input (the templated caption's
states at their own length, the key mask, ``img_shapes``, the timestep sigma, no guidance) equals the
pipeline's: conditional, and for a dropped caption its true-CFG branch (the encoded negative prompt).
The stored latents decode with the pipeline's own step; the objective's shift is the pipeline
scheduler's for that token count; a batch of captions of
different lengths gets the mask and length ``encode_prompt`` gives the same batch.

Run with -s to see the largest difference of each input."""

import math

import pytest
import torch

from opendit_lite.builders.video import build_video_model
from opendit_lite.families import FAMILIES
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.training.video import prepare_video_data
from tests.families.pipeline_capture import capture, model_latents, record_differences, training_step_inputs
from tests.families.test_pipeline_conditioning import CAPTION
from tests.pipeline_runs import pipeline_config, write_csv, write_image

TRUE_CFG = dict(true_cfg_scale=2.0, negative_prompt="")


def test_a_training_step_feeds_qwen_image_what_its_pipeline_feeds_it(tiny_pipeline, tmp_path):
    from diffusers import DiffusionPipeline
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    folder, call = tiny_pipeline("qwenimage"), TINY_CALLS["qwenimage"]
    csv = write_csv(tmp_path, [(write_image(tmp_path / "image.png", 40, 48).rsplit("/", 1)[-1], CAPTION)])
    cfg = pipeline_config(folder, csv, call, str(tmp_path / "results"), "model.class_dropout_prob=0.5")
    data = prepare_video_data(cfg, torch.device("cpu"))
    clip, caption = data.dataset[0]
    x0, text = data.model_inputs((clip[None], [caption]))                         # [1, C, 1, h, w], {key: [1, ...]}
    model = build_video_model(cfg)
    denoiser = data.denoiser(model, model)
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    # the stored latents: the VAE's posterior mode of the image as a 1-frame clip, normalised by the inverse
    # of the pipeline's step before decoding (latents / (1 / std) + mean)
    with torch.no_grad():
        z = pipe.vae.encode(clip[None, :, :1]).latent_dist.mode()                 # [1, C, 1, h, w]
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
    torch.testing.assert_close(x0 / inv_std + mean, z, rtol=1e-5, atol=1e-5)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    calls = capture(pipe, CAPTION, noise=noise, **call, **TRUE_CFG)
    objective = data.objective(tuple(x0.shape))

    # the training shift is the one the pipeline's scheduler samples this token count with
    config = pipe.scheduler.config
    tokens = (x0.shape[-2] // 2) * (x0.shape[-1] // 2)
    mu = calculate_shift(tokens, config.base_image_seq_len, config.max_image_seq_len, config.base_shift,
                         config.max_shift)
    assert objective.shift == pytest.approx(math.exp(mu))

    largest, losses = {}, []
    for step in sorted({c.step for c in calls.calls}):
        for dropped in (False, True):
            ref = calls.unconditional(step) if dropped else calls.conditional(step)
            t = ref["timestep"].reshape(-1)[:1].float()                           # the pipeline passes sigma
            latents = model_latents(pipe, ref["hidden_states"], x0.shape)
            seen, loss = training_step_inputs(model, objective, denoiser, x0, text, latents, t, dropped)
            losses.append(loss)
            record_differences(largest, seen, ref)
    print("\nqwenimage: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    for key, diff in largest.items():
        assert diff <= (1e-5 if key in ("hidden_states", "timestep") else 0.0), f"{key} differs by {diff}"
    torch.stack(losses).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())

    # a batch of captions of different lengths: the pipeline's states, length and mask for that batch
    conditioning = FAMILIES["qwen_image"].conditioning
    captions = ["a red square", "a small blue disc moving left on a dark background"]
    states, mask = pipe.encode_prompt(captions, device="cpu", max_sequence_length=512)
    stored = conditioning.encode_text(pipe, captions)
    assert stored["encoder_hidden_states"].shape[1] == stored["encoder_hidden_states_mask"].shape[1] == 512
    mine = conditioning.inputs(pipe.transformer.config, conditioning.constants(pipe, pipe.transformer.config, None),
                               x0.expand(2, -1, -1, -1, -1), torch.full([2], 500.0), stored)
    assert mask is not None and torch.equal(mine["encoder_hidden_states_mask"], mask)
    assert torch.equal(mine["encoder_hidden_states"], states)
