"""A training step of a run from a Z-Image pipeline folder (``model.pipeline``, ``data.type: csv``) feeds
``ZImageTransformer2DModel`` what ``ZImagePipeline`` feeds it, for the base layout (classifier-free
guidance: one call per step on [conditional, unconditional] lists) and the Turbo layout (guidance 0:
the conditional call alone): the pipeline is called on a caption with a fixed noise and a forward
pre-hook records every argument of every transformer call (the pipeline passes the latents, the time
and the caption states positionally); the trainer encodes a captioned image with the same caption and
takes its training loss at the pipeline's time with the noise that puts its noisy latents where the
pipeline's are. The latents list, the timestep (1 - sigma) and the caption-state list (cut to the real
tokens) equal the pipeline's, conditional and, for a dropped caption, its unconditional branch (the
encoded empty prompt). The training shift is the pipeline scheduler's, and the CSV route and the
latents route (scripts/extract_latents.py --pipeline) give identical inputs.

Run with -s to see the largest difference of each input."""

import inspect

import torch
from torch.utils.data import default_collate

from opendit_lite.builders.video import build_video_model
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.training.video import prepare_video_data
from tests.families.pipeline_capture import difference
from tests.pipeline_runs import extract_script, pipeline_config, write_csv, write_image

CAPTION = "a red square moving left"
IGNORED = {"joint_attention_kwargs", "return_dict"}


def _bound(module, args, kwargs):
    """A transformer call's arguments by the names of its forward (positional ones included)."""
    arguments = inspect.signature(type(module).forward).bind(module, *args, **kwargs).arguments
    arguments.pop("self")
    return {k: v for k, v in arguments.items() if k not in IGNORED}


def _clone(value):
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return [_clone(v) for v in value]
    return value


def _capture(pipe, noise, **call):
    """Every transformer call of ``pipe(CAPTION, latents=noise[:, :, 0], ...)``: (step, arguments)."""
    calls, state = [], {"step": 0}

    def record(module, args, kwargs):
        calls.append((state["step"], {k: _clone(v) for k, v in _bound(module, args, kwargs).items()}))

    def next_step(pipeline, step, timestep, tensors):
        state["step"] = step + 1
        return {}

    handle = pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            pipe(CAPTION, latents=noise[:, :, 0], output_type="latent", callback_on_step_end=next_step, **call)
    finally:
        handle.remove()
    return calls


def _branch(arguments, conditional: bool):
    """The conditional or unconditional half of a call on [conditional, unconditional] (one sample)."""
    rows = len(arguments["x"])
    if rows == 1:
        assert conditional, "the pipeline ran no unconditional branch"
        return arguments
    assert rows == 2
    half = slice(0, 1) if conditional else slice(1, 2)
    return {k: (v[half] if isinstance(v, list) or (torch.is_tensor(v) and v.dim() and v.shape[0] == rows) else v)
            for k, v in arguments.items()}


def test_a_training_step_feeds_the_transformer_what_z_image_pipeline_feeds_it(tiny_pipeline, tmp_path):
    from diffusers import DiffusionPipeline

    folder = tiny_pipeline("z_image")  # the base and Turbo layouts differ in their call only
    write_image(tmp_path / "image.png", 40, 48)
    csv = write_csv(tmp_path, [("image.png", CAPTION)])
    cfg = pipeline_config(folder, csv, TINY_CALLS["z_image"], str(tmp_path / "runs"), "model.class_dropout_prob=0.5")
    data = prepare_video_data(cfg, torch.device("cpu"))
    clip, caption = data.dataset[0]
    x0, text = data.model_inputs((clip[None], [caption]))                        # [1, C, 1, h, w], {key: [1, ...]}
    model = build_video_model(cfg)
    denoiser = data.denoiser(model, model)
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    objective = data.objective(tuple(x0.shape))
    largest, losses = {}, []
    for name in ("z_image", "z_image_turbo"):
        call = TINY_CALLS[name]
        calls = _capture(pipe, noise, **call)
        guided = name == "z_image"
        assert [len(a["x"]) for _, a in calls] == [2 if guided else 1] * call["num_inference_steps"]

        # The training shift is the one the pipeline's scheduler applied to its sigmas.
        steps = call["num_inference_steps"]
        sigmas = torch.linspace(1.0, 1 / steps, steps, dtype=torch.float64)             # the pipeline's default
        shifted = objective.shift * sigmas / (1 + (objective.shift - 1) * sigmas)
        assert torch.allclose(shifted, pipe.scheduler.sigmas[:-1].double(), atol=1e-6)

        for step, arguments in calls:
            for dropped in ((False, True) if guided else (False,)):
                ref = _branch(arguments, conditional=not dropped)
                t = (1 - ref["t"].double()).float()                        # Z-Image's time counts from the noise
                latents = torch.stack(ref["x"]).float()                    # [1, C, 1, h, w]
                seen = {}
                hook = model.register_forward_pre_hook(lambda m, a, k: seen.update(_bound(m, a, k)),
                                                       with_kwargs=True)
                try:
                    kwargs = dict(text, drop=torch.tensor([dropped]))
                    losses.append(objective.training_losses(denoiser, x0, model_kwargs=kwargs,
                                                            noise=(latents - (1 - t) * x0) / t, t=t)["loss"])
                finally:
                    hook.remove()
                assert set(seen) == set(ref), f"{sorted(seen)} vs {sorted(ref)}"
                for key in sorted(ref):
                    largest[key] = max(largest.get(key, 0.0), difference(seen[key], ref[key]))
    print("\nZImagePipeline: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    assert largest["cap_feats"] == 0.0                                       # the same states, cut the same way
    assert largest["x"] <= 1e-5 and largest["t"] <= 1e-6                     # the noise solved for in fp32
    torch.stack(losses).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_the_csv_route_and_the_latents_route_give_identical_z_image_inputs(tiny_pipeline, tmp_path):
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.training.video import validate_video_config

    folder, call = tiny_pipeline("z_image"), TINY_CALLS["z_image"]
    captions = (CAPTION, "a blue disc")
    csv = write_csv(tmp_path, [(write_image(tmp_path / f"{i}.png", 40, 48, seed=i), c)
                               for i, c in enumerate(captions)])
    out = str(tmp_path / "latents")
    assert extract_script().main(["--pipeline", folder, "--csv", csv, "--num-frames", "1", "--height", "32",
                                  "--width", "32", "--batch-size", "1", "--num-workers", "0", "--output", out]) == 2
    from_csv = pipeline_config(folder, csv, call, str(tmp_path / "runs"))
    from_latents = load_config(None, [f"model.pipeline={folder}", "data.type=latents", f"data.path={out}",
                                      "precision=fp32", "global_batch_size=1", f"results_dir={tmp_path}/runs"],
                               schema=VideoTrainConfig)
    validate_video_config(from_latents)
    csv_data = prepare_video_data(from_csv, torch.device("cpu"))
    latent_data = prepare_video_data(from_latents, torch.device("cpu"))
    for i in range(len(captions)):
        clip, caption = csv_data.dataset[i]
        x, text = csv_data.model_inputs((clip[None], [caption]))
        y, stored = latent_data.model_inputs(default_collate([latent_data.dataset[i]]))
        assert torch.equal(x, y) and text.keys() == stored.keys() == {"cap_feats", "cap_mask"}
        assert all(torch.equal(text[k], stored[k]) for k in text), f"row {i}"
    assert csv_data.objective(tuple(x.shape)).shift == latent_data.objective(tuple(x.shape)).shift == 3.0


def test_the_family_route_refuses_z_image_text_and_names_the_pipeline_route(tiny_pipeline):
    """``--family z_image`` would encode captions without Qwen3's chat template and from the last hidden
    state: refused with the --pipeline route named."""
    import os

    import pytest

    from opendit_lite.encoders.family_encoders import load_family_text_encoder
    from opendit_lite.errors import ConfigError
    from opendit_lite.families import find_family

    folder = tiny_pipeline("z_image")
    with pytest.raises(ConfigError, match="qwen3 text encoder.*extract the latents with scripts/extract_latents.py "
                                          "--pipeline"):
        load_family_text_encoder(find_family("zimage").encoding, os.path.join(folder, "text_encoder"), "the folder",
                                 tokenizer_path=os.path.join(folder, "tokenizer"))
