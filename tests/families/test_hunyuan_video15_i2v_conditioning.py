"""HunyuanVideo 1.5 image-to-video (``HunyuanVideo15ImageToVideoPipeline``, a variant of the family): a
training step of a run from its pipeline folder on a captioned clip (the CSV route; the conditioning
image is the clip's own first frame as loaded) feeds the transformer what the pipeline feeds it when
called with that frame as its image (captured by forward pre-hooks): the latents with the image's
condition latents on frame 0 and the mask channel, SigLIP's image states, the caption's and glyph
states, ``timestep_r=None``, the timestep; for a dropped caption, the unconditional branch with the
same image. A MeanFlow-distilled transformer (``use_meanflow``) is refused.

Run with -s to see the largest difference of each input."""

import pytest
import torch

from opendit_lite.builders.video import build_video_model
from opendit_lite.errors import ConfigError
from opendit_lite.families import FAMILIES, conditioning_of_pipeline
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.training.video import prepare_video_data
from tests.families.pipeline_capture import capture, model_latents, record_differences, training_step_inputs
from tests.pipeline_runs import pipeline_config, write_clip, write_csv

CAPTION = 'a red square with the sign "OPEN" moving left'
SIZE = 32  # a size the pipeline keeps: its bucket for a 32 x 32 image is 32 x 32 (target_size 32)


def _pil(frame: torch.Tensor):
    """[3, H, W] in [-1, 1] (a frame decoded from 8-bit video) -> the 8-bit PIL image it came from."""
    from PIL import Image

    return Image.fromarray(((frame + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy())


def test_a_training_step_feeds_what_the_image_to_video_pipeline_feeds(tiny_pipeline, tmp_path):
    from diffusers import DiffusionPipeline

    folder = tiny_pipeline("hunyuanvideo15_i2v")
    call = dict(TINY_CALLS["hunyuanvideo15_i2v"], height=SIZE)
    write_clip(tmp_path / "clip.mp4", 12, 40, 48)
    csv = write_csv(tmp_path, [("clip.mp4", CAPTION)], "clips.csv")
    cfg = pipeline_config(folder, csv, call, str(tmp_path), "model.class_dropout_prob=0.5")
    data = prepare_video_data(cfg, torch.device("cpu"))
    clip, caption, images = data.dataset[0]
    assert len(images) == 1 and torch.equal(images[0], clip[:, 0])               # the clip's own first frame
    x0, inputs = data.model_inputs((clip[None], [caption], [images]))            # [1, C, T, h, w], {key: [1, ...]}
    model = build_video_model(cfg)
    denoiser = data.denoiser(model, model)
    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    calls = capture(pipe, CAPTION, noise=noise, image=_pil(images[0]), num_frames=call["num_frames"],
                    num_inference_steps=1)
    objective = data.objective(tuple(x0.shape))

    largest, C = {}, x0.shape[1]
    for dropped in (False, True):
        ref = calls.unconditional(0) if dropped else calls.conditional(0)
        t = (ref["timestep"].reshape(-1)[:1].double() / 1000).float()
        latents = model_latents(pipe, ref["hidden_states"][:, :C], x0.shape)
        seen, loss = training_step_inputs(model, objective, denoiser, x0, inputs, latents, t, dropped)
        record_differences(largest, seen, ref)
    print("\nhunyuanvideo15_i2v: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    for key, diff in largest.items():
        assert diff <= (1e-5 if key == "hidden_states" else 0.0), f"{key} differs by {diff}"  # the noise solved for
    assert calls.conditional(0)["hidden_states"][:, C:2 * C, 0].abs().sum() > 0  # the image's latents arrive


def test_the_variant_is_found_by_its_pipeline_class_and_refuses_meanflow(tiny_pipeline):
    from diffusers import HunyuanVideo15Transformer3DModel

    conditioning = conditioning_of_pipeline("HunyuanVideo15ImageToVideoPipeline")
    assert conditioning is FAMILIES["hunyuan_video15"].conditioning_of("HunyuanVideo15ImageToVideoPipeline")
    assert conditioning.image_input == "first_frame" and conditioning.max_images == 1
    config = HunyuanVideo15Transformer3DModel.load_config(tiny_pipeline("hunyuanvideo15_i2v"), subfolder="transformer")
    assert conditioning.constants(None, config, None) == {}
    with pytest.raises(ConfigError, match="MeanFlow"):
        conditioning.constants(None, dict(config, use_meanflow=True), None)
