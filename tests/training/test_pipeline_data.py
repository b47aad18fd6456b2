"""The two data routes of a run from a pipeline folder: the CSV route (images or clips encoded while
training by the pipeline's own VAE and text encoders) and the latents route (the same encoded once by
scripts/extract_latents.py --pipeline) give identical training inputs, unconditional text and shift;
latents of several sizes train in buckets, each bucket at its own size with the token-count shift the
pipeline's scheduler gives its latent shape (Flux)."""

import math

import pytest
import torch
from torch.utils.data import default_collate

from opendit_lite.config import load_config
from opendit_lite.config.video_schema import VideoTrainConfig
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.training.video import prepare_video_data, validate_video_config
from tests.pipeline_runs import extract_script, pipeline_config, write_clip, write_csv, write_image

CAPTIONS = ("a red square moving left", "a blue disc", "green ball falling down fast")


def _latents_config(folder: str, latents: str, results: str, *extra: str):
    cfg = load_config(None, [f"model.pipeline={folder}", "data.type=latents", f"data.path={latents}",
                             "precision=fp32", "global_batch_size=1", f"results_dir={results}", *extra],
                      schema=VideoTrainConfig)
    validate_video_config(cfg)
    return cfg


def _equal(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["wan", "flux"])
def test_the_csv_route_and_the_latents_route_give_identical_training_inputs(name, tiny_pipeline, tmp_path):
    folder, call = tiny_pipeline(name), TINY_CALLS[name]
    frames = call.get("num_frames", 1)
    media = tmp_path / "media"
    media.mkdir()
    rows = []
    for i, caption in enumerate(CAPTIONS):  # clips of exactly the frames trained on: the same start either way
        file = write_clip(media / f"{i}.mp4", frames, 40, 48, seed=i) if frames > 1 else \
            write_image(media / f"{i}.png", 40, 48, seed=i)
        rows.append((file, caption))
    csv = write_csv(media, rows)
    out = str(tmp_path / "latents")
    option = "--pipeline" if name == "wan" else "--pipeline-path"  # a whole pipeline folder, by either option
    count = extract_script().main([option, folder, "--csv", csv, "--num-frames", str(frames), "--height", "32",
                                   "--width", "32", "--frame-interval", "1", "--batch-size", "1", "--num-workers", "0",
                                   "--output", out])
    assert count == len(CAPTIONS)

    from_csv = pipeline_config(folder, csv, call, str(tmp_path / "runs"))
    from_latents = _latents_config(folder, out, str(tmp_path / "runs"))
    csv_data = prepare_video_data(from_csv, torch.device("cpu"))
    latent_data = prepare_video_data(from_latents, torch.device("cpu"))
    for i in range(len(CAPTIONS)):
        clip, caption = csv_data.dataset[i]
        x, text = csv_data.model_inputs((clip[None], [caption]))
        y, stored = latent_data.model_inputs(default_collate([latent_data.dataset[i]]))
        assert torch.equal(x, y) and _equal(text, stored), f"row {i}"
        assert latent_data.dataset[i][2] == caption
    model = torch.nn.Linear(1, 1)
    model.config = {}
    assert _equal(csv_data.denoiser(model, model).null_text, latent_data.denoiser(model, model).null_text)
    assert csv_data.objective(tuple(x.shape)).shift == latent_data.objective(tuple(x.shape)).shift
    for section in ("model", "text_encoder"):  # the run records the same model either way
        assert getattr(from_csv, section) == getattr(from_latents, section)


class _Log:
    def write(self, line: str) -> None:
        pass


def test_flux_latents_of_two_sizes_train_in_buckets_each_with_its_token_count_shift(tiny_pipeline, tmp_path):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    from opendit_lite.precision import resolve_precision

    folder = tiny_pipeline("flux")
    media = tmp_path / "media"
    media.mkdir()
    rows = [(write_image(media / f"{i}.png", 32, 32 if i % 2 else 48, seed=i), c) for i, c in enumerate(CAPTIONS * 2)]
    csv = write_csv(media, rows)
    buckets = "[{height: 32, width: 32, batch_size: 1}, {height: 32, width: 48, batch_size: 1}]"
    config = tmp_path / "flux.yaml"
    config.write_text(f"model: {{pipeline: {folder}}}\ndata: {{type: csv, path: {csv}, buckets: {buckets}}}\n")
    out = str(tmp_path / "latents")
    assert extract_script().main(["--config", str(config), "--num-workers", "0", "--output", out]) == 6

    cfg = _latents_config(folder, out, str(tmp_path / "runs"), f"data.buckets={buckets}")
    data = prepare_video_data(cfg, torch.device("cpu"))
    sampler = data.batch_sampler(None, 0, 1, 1, _Log(), precision=resolve_precision("fp32", "cpu"))
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(f"{folder}/scheduler").config
    seen = {}
    for batch_indices in sampler:
        x, _ = data.model_inputs(default_collate([data.dataset[i] for i in batch_indices]))
        (index, frames, height, width), = batch_indices
        assert x.shape[2:] == (1, height // 2, width // 2)                     # the VAE halves the sides
        tokens = (height // 4) * (width // 4)                                    # 2x2 packed latent patches
        expected = math.exp(calculate_shift(tokens, scheduler["base_image_seq_len"], scheduler["max_image_seq_len"],
                                            scheduler["base_shift"], scheduler["max_shift"]))
        assert data.objective(tuple(x.shape)).shift == pytest.approx(expected, rel=1e-12)
        assert data.loss_weight(default_collate([data.dataset[i] for i in batch_indices])) == 1.0
        seen[(height, width)] = seen.get((height, width), 0) + 1
    assert seen == {(32, 32): 3, (32, 48): 3}
    assert data.objective((1, 16, 1, 16, 16)).shift != data.objective((1, 16, 1, 16, 24)).shift


def test_the_latents_route_stores_an_image_to_video_run_s_image_inputs(tiny_pipeline, tmp_path):
    """Wan 2.1 image-to-video: the condition channels and CLIP image states extracted once equal those the
    CSV route encodes from the clip's own first frame, with the text inputs."""
    folder, call = tiny_pipeline("wan_i2v"), TINY_CALLS["wan_i2v"]
    frames = call["num_frames"]
    media = tmp_path / "media"
    media.mkdir()
    csv = write_csv(media, [(write_clip(media / f"{i}.mp4", frames, 40, 48, seed=i), c) for i, c in
                            enumerate(CAPTIONS[:2])])
    out = str(tmp_path / "latents")
    extract_script().main(["--pipeline", folder, "--csv", csv, "--num-frames", str(frames), "--height", "32",
                           "--width", "32", "--frame-interval", "1", "--batch-size", "1", "--num-workers", "0",
                           "--output", out])
    csv_data = prepare_video_data(pipeline_config(folder, csv, call, str(tmp_path / "runs")), torch.device("cpu"))
    latent_data = prepare_video_data(_latents_config(folder, out, str(tmp_path / "runs")), torch.device("cpu"))
    for i in range(2):
        clip, caption, images = csv_data.dataset[i]
        x, inputs = csv_data.model_inputs((clip[None], [caption], [images]))
        y, stored = latent_data.model_inputs(default_collate([latent_data.dataset[i]]))
        assert "encoder_hidden_states_image" in inputs and len(inputs) > 2
        assert torch.equal(x, y) and _equal(inputs, stored), f"row {i}"


@pytest.mark.parametrize("name", ["flux_kontext", "qwenimage_edit"])
def test_the_latents_route_stores_an_edit_run_s_references(name, tiny_pipeline, tmp_path, monkeypatch):
    """FLUX.1 Kontext and Qwen-Image-Edit: the reference inputs extracted once (the packed reference latents and
    their ids / patch grids; Qwen-Edit's caption and per-sample null text encoded with the reference) equal those
    the CSV route encodes from the rows' ``image`` column, with the latents and the text. The pipelines' reference
    sizes (about a megapixel) are shrunk in their modules, read alike by both routes, as in their own tests."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    from diffusers import DiffusionPipeline
    from diffusers.pipelines.flux import pipeline_flux_kontext

    from opendit_lite.families import conditioning_of_pipeline
    from opendit_lite.families.conditioning_base import PipelineConditioning, null_text_key

    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: original(48 * 48, ratio))
    monkeypatch.setattr(pipeline_flux_kontext, "PREFERRED_KONTEXT_RESOLUTIONS", [(24, 40), (30, 30), (42, 22)])
    folder, call = tiny_pipeline(name), TINY_CALLS[name]
    media = tmp_path / "media"
    media.mkdir()
    rows = [f"{write_image(media / f'{i}.png', 32, 32, seed=i)},{caption},"
            f"{write_image(media / f'r{i}.png', 50, 30, seed=9 + i)}" for i, caption in enumerate(CAPTIONS[:1])]
    csv = media / "edits.csv"
    csv.write_text("path,text,image\n" + "".join(f"{row}\n" for row in rows))
    out = str(tmp_path / "latents")
    extract_script().main(["--pipeline", folder, "--csv", str(csv), "--num-frames", "1", "--height", "32", "--width",
                           "32", "--batch-size", "1", "--num-workers", "0", "--output", out])
    csv_data = prepare_video_data(pipeline_config(folder, str(csv), call, str(tmp_path / "runs")), torch.device("cpu"))
    latent_data = prepare_video_data(_latents_config(folder, out, str(tmp_path / "runs")), torch.device("cpu"))
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    conditioning = conditioning_of_pipeline(type(pipe).__name__)
    for i in range(1):  # one row: the rows' order is the Wan image-to-video test's
        clip, caption, images = csv_data.dataset[i]
        x, inputs = csv_data.model_inputs((clip[None], [caption], [images]))
        y, stored = latent_data.model_inputs(default_collate([latent_data.dataset[i]]))
        keys = set(conditioning.image_keys) | {null_text_key(k) for k in conditioning.text_keys
                                               if conditioning.null_text_per_image}
        assert keys <= set(stored) and len(keys) >= 2, sorted(stored)
        assert torch.equal(x, y) and _equal(inputs, stored), f"row {i}"
    if conditioning.null_text_per_image:  # the shared encoding of caption and null text: the protocol's two calls
        with torch.no_grad():
            shared = conditioning.encode_text_and_null(pipe, [caption], [images])
            apart = PipelineConditioning.encode_text_and_null(conditioning, pipe, [caption], [images])
        assert all(_equal(a, b) for a, b in zip(shared, apart))
