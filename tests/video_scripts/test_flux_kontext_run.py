"""A FLUX.1 Kontext LoRA run from its pipeline folder (``model.pipeline`` of ``FluxKontextPipeline``) on a CSV
with an ``image`` column, end to end on the tiny pipeline: the data reads the reference resized as the pipeline
resizes it (in a bucket of another size too) and encodes it to the pipeline's own reference latents; train.py
trains 2 steps; the export loads with ``load_lora_weights`` without a key warning; sample.py with
``sample.images`` writes what the pipeline called directly with the export loaded gives (fp32, 1e-5), at the
asked 32 x 32 (``max_area``, not Kontext's one megapixel). (References of one batch resized to different sizes
are refused: the conditioning test.)

The pipeline's preferred resolutions (about one megapixel each) are swapped for small ones, read alike by the
pipeline and the run (both in this process), so that the tiny transformer sees tens of reference tokens.
"""

import os

import pytest
import torch

from opendit_lite.diffusion.sampling_utils import SampleGenerators
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.families.pipeline_capture import capture
from tests.pipeline_runs import pipeline_config, write_image
from tests.video_scripts.test_family_scripts import main
from tests.video_scripts.test_lora_export import LoadLog
from tests.video_scripts.test_pipeline_sampling import script_clips

CAPTION = "a red square moving left"
SMALL_RESOLUTIONS = [(24, 40), (30, 30), (42, 22)]   # (width, height), as diffusers lists them
STEPS = 2


@pytest.fixture(autouse=True)
def small_resolutions(monkeypatch):
    from diffusers.pipelines.flux import pipeline_flux_kontext

    monkeypatch.setattr(pipeline_flux_kontext, "PREFERRED_KONTEXT_RESOLUTIONS", SMALL_RESOLUTIONS)


def _csv(folder, rows) -> str:
    path = os.path.join(str(folder), "edits.csv")
    with open(path, "w") as f:
        f.write("path,text,image\n" + "".join(f"{target},{caption},{reference}\n" for target, caption, reference
                                             in rows))
    return path


def _args(folder, csv, results, *extra):
    return [f"model.pipeline={folder}", "data.type=csv", f"data.path={csv}", "data.image_size=32",
            "precision=fp32", "global_batch_size=1", "lr=5e-3", "ckpt_every=0", "lora.rank=4", "lora.alpha=4",
            "exp_name=kontext", f"results_dir={results}", "logger=[]", *extra]


def test_a_kontext_lora_run_trains_on_references_and_samples_what_its_pipeline_gives(tiny_pipeline, tmp_path):
    from diffusers import FluxKontextPipeline
    from PIL import Image

    from opendit_lite.sampling.pipeline_sampling import pipeline_pixels
    from opendit_lite.training.video import prepare_video_data

    folder, call = tiny_pipeline("flux_kontext"), dict(TINY_CALLS["flux_kontext"])
    write_image(tmp_path / "target.png", 32, 32, seed=1)
    reference = write_image(tmp_path / "reference.png", 50, 30, seed=2)          # resized to 40 x 24
    csv = _csv(tmp_path, [("target.png", CAPTION, "reference.png")])
    pipe = FluxKontextPipeline.from_pretrained(folder, local_files_only=True)

    # the data: the reference resized as the pipeline resizes it, encoded to the pipeline's reference latents
    cfg = pipeline_config(folder, csv, call, str(tmp_path))
    data = prepare_video_data(cfg, torch.device("cpu"))
    clip, caption, images = data.dataset[0]
    _, inputs = data.model_inputs((clip[None], [caption], [images]))
    bucket_clip, _, bucket_images = data.dataset[(0, 1, 32, 48)]  # in a bucket of another size: the same reference
    assert bucket_clip.shape == (3, 1, 32, 48) and torch.equal(bucket_images[0], images[0])
    picture = Image.open(reference).convert("RGB")
    ref = capture(pipe, CAPTION, image=picture, stop_after_step=0, **call).conditional(0)
    packed = inputs["reference_latents"]                                         # [1, 10 x 6, 64]
    assert images[0].shape == (3, 40, 24) and packed.shape == (1, 60, 64)
    assert (packed - ref["hidden_states"][:, 64:]).abs().max() <= 1e-5
    assert torch.equal(inputs["reference_ids"][0], ref["img_ids"][64:])

    # 2 LoRA steps, then sample.py with sample.images against the pipeline called directly with the export
    args = _args(folder, csv, tmp_path)
    main("train", [*args, "max_steps=2"])
    ours = script_clips("sample", [*args, f"sample.prompts={[CAPTION]}", f"sample.images={[reference]}",
                                   f"sample.num_sampling_steps={STEPS}"])

    def direct():
        generators = SampleGenerators(0, range(1)).generators
        with torch.no_grad():
            return pipeline_pixels(pipe(prompt=[CAPTION], image=picture, generator=generators, output_type="pt",
                                        height=32, width=32, max_area=32 * 32, num_inference_steps=STEPS)).float()

    base = direct()
    with LoadLog() as log:
        pipe.load_lora_weights(os.path.join(str(tmp_path), "kontext", "diffusers"))
    assert not log.key_warnings(), log.text()
    reference_clips = direct()
    assert ours.shape == reference_clips.shape == (1, 3, 1, 32, 32)
    difference = (ours - reference_clips).abs().max().item()
    print(f"\nsample.py vs the pipeline with the export: {difference:.2g}")
    assert difference <= 1e-5
    assert (reference_clips - base).abs().max() > 1e-5  # the LoRA changes the samples
