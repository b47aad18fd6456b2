"""Wan 2.1 FLF2V (a ``WanImageToVideoPipeline`` whose transformer has ``pos_embed_seq_len``) trains on the
clip's first and last frames conditioned as ``__call__(image=first, last_image=last)`` conditions it: the
mask and condition latents of first frame, black frames, last frame, and both images' CLIP states; and
samples through that call with ``sample.images`` giving both frames.

For the same caption, frames, noise and time, the pipeline's call is recorded with forward pre-hooks
(``pipeline_capture.capture``) and a training step's inputs, through the trainer's data (the CSV route,
``PipelineEncoders``) and objective, with and without the caption, are compared keyword by keyword.
Run with -s to see the largest difference of each input."""

import PIL.Image
import pytest
import torch

from opendit_lite.families.tiny_pipelines import TINY_CALLS
from opendit_lite.families.wan.conditioning_i2v import IMAGE_STATES
from tests.families.pipeline_capture import capture, record_differences, training_step_inputs

CAPTION = "a red square moving left"


def _as_picture(image: torch.Tensor) -> PIL.Image.Image:
    """[3, H, W] in [-1, 1] read from 8-bit frames -> that 8-bit picture (what a user gives the pipeline)."""
    pixels = ((image.permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    return PIL.Image.fromarray(pixels)


def test_a_training_step_and_sampling_condition_on_the_first_and_last_frame_as_the_pipeline(tiny_pipeline,
                                                                                            tmp_path):
    from diffusers import WanImageToVideoPipeline

    from opendit_lite.builders.pipeline import check_conditioning_rows, pipeline_folder
    from opendit_lite.builders.video import build_video_model
    from opendit_lite.data.video_csv import collate_conditioned
    from opendit_lite.diffusion.sampling_utils import SampleGenerators
    from opendit_lite.errors import ConfigError
    from opendit_lite.families.wan.conditioning_i2v import WanFirstLastFrameConditioning, clean_prompts_without_ftfy
    from opendit_lite.sampling import sampling_ranks
    from opendit_lite.sampling.pipeline_sampling import pipeline_batches, pipeline_pixels, sample_images
    from opendit_lite.training.video import prepare_video_data
    from tests.pipeline_runs import pipeline_config, write_clip, write_csv, write_image

    folder, call = tiny_pipeline("wan_flf2v"), TINY_CALLS["wan_flf2v"]
    assert isinstance(pipeline_folder(folder).conditioning, WanFirstLastFrameConditioning)
    write_clip(tmp_path / "clip.mp4", 8, call["height"], call["width"])
    clips = write_csv(tmp_path, [("clip.mp4", CAPTION)], "clips.csv")  # no image column: the clip's own frames
    cfg = pipeline_config(folder, clips, call, str(tmp_path), "model.class_dropout_prob=0.5")
    data = prepare_video_data(cfg, torch.device("cpu"))
    _, batch = collate_conditioned([(0, data.dataset[0])])
    clip, (first, last) = batch[0][0], batch[2][0]                       # [3, T, H, W], 2 x [3, H, W]
    assert torch.equal(first, clip[:, 0]) and torch.equal(last, clip[:, -1])
    x0, inputs = data.model_inputs(batch)                                # latents [1, 16, T, h, w], text and images
    assert inputs[IMAGE_STATES].shape == (1, 2, 17, 16)                  # each image's 17 CLIP tokens
    model = build_video_model(cfg)
    denoiser, objective = data.denoiser(model, model), data.objective(tuple(x0.shape))

    clean_prompts_without_ftfy()
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    calls = capture(pipe, CAPTION, noise=noise, image=_as_picture(first), last_image=_as_picture(last),
                    stop_after_step=0, **call)
    largest = {}
    for dropped in (False, True):
        ref = calls.unconditional(0) if dropped else calls.conditional(0)
        t = (ref["timestep"].reshape(-1).max().double() / 1000).float()[None]
        seen, _ = training_step_inputs(model, objective, denoiser, x0, inputs, ref["hidden_states"][:, :16], t, dropped)
        record_differences(largest, seen, ref)
    print("\nFLF2V from a CSV: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    assert ref[IMAGE_STATES].shape == (2, 17, 16)                       # the first's and the last's states, as rows
    for key, diff in largest.items():  # hidden_states: the noise solved for in fp32
        assert diff <= {"hidden_states": 1e-5}.get(key, 0.0), f"{key} differs by {diff}"

    # Sampling: sample.images gives each prompt's 'first|last' files; the pipeline's own call on them.
    first_file, last_file = (write_image(tmp_path / f"{n}.png", call["height"], call["width"], seed=s)
                             for n, s in (("first", 3), ("last", 4)))
    sampled_cfg = pipeline_config(folder, clips, call, str(tmp_path), f"sample.images=['{first_file}|{last_file}']",
                                  f"sample.prompts=[{CAPTION}]", "sample.num_sampling_steps=1", "sample.seed=5")
    with sampling_ranks(1) as ranks:
        (indices, sampled), = list(pipeline_batches(pipe, sampled_cfg, [CAPTION], ranks))
    with torch.no_grad():
        direct = pipe(image=PIL.Image.open(first_file).convert("RGB"), last_image=PIL.Image.open(last_file)
                      .convert("RGB"), prompt=CAPTION, output_type="pt",
                      generator=SampleGenerators(5, range(1)).generators, **dict(call, num_inference_steps=1))
    assert list(indices) == [0] and torch.equal(sampled, pipeline_pixels(direct).float())

    # Refused: one frame for a prompt or a row (both or none), three for a row.
    sampled_cfg.sample.images = [first_file]
    with pytest.raises(ConfigError, match=r"takes 2 \('first.png\|last.png'\) per prompt"):
        sample_images(sampled_cfg, 1)
    flf2v = pipeline_folder(folder)
    with pytest.raises(ConfigError, match="line 2.*name both files, 'first.png|last.png', or none"):
        check_conditioning_rows(flf2v, "clips.csv", [(first_file,)], ["line 2"])
    with pytest.raises(ConfigError, match="more conditioning images than the 2"):
        check_conditioning_rows(flf2v, "clips.csv", [(first_file, last_file, first_file)], ["line 2"])
    check_conditioning_rows(flf2v, "clips.csv", [(first_file, last_file), ()], ["line 2", "line 3"])


def test_a_row_naming_both_frames_gives_those_files_resized_and_cropped_as_the_clip(tmp_path):
    from opendit_lite.data.video_csv import ConditioningImages, VideoCSVDataset, load_image, resize_center_crop
    from tests.pipeline_runs import write_clip, write_image

    write_clip(tmp_path / "clip.mp4", 6, 32, 48)
    first, last = write_image(tmp_path / "a.png", 40, 40, seed=1), write_image(tmp_path / "b.png", 24, 64, seed=2)
    (tmp_path / "rows.csv").write_text("path,text,image\nclip.mp4,one,a.png|b.png\nclip.mp4,two,\n")
    dataset = VideoCSVDataset(str(tmp_path / "rows.csv"), num_frames=5, frame_interval=1, image_size=16,
                              random_start=False, images=ConditioningImages("first_last_frames", 2))
    clip, _, images = dataset[0]
    assert [tuple(i.shape) for i in images] == [(3, 16, 16)] * 2
    for image, path in zip(images, (first, last)):
        assert torch.equal(image, resize_center_crop(load_image(path), 16, 16)[:, 0])
    clip, _, (a, b) = dataset[1]
    assert torch.equal(a, clip[:, 0]) and torch.equal(b, clip[:, -1])
