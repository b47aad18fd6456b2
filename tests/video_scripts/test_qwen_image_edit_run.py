"""A Qwen-Image-Edit LoRA run from its pipeline folder (``QwenImageEditPipeline``; ``QwenImageEditPlusPipeline``
with two references a row) on a CSV with an ``image`` column, end to end on the tiny pipelines: train.py
trains a step, the export loads with ``load_lora_weights`` without a key warning, and sample.py with
``sample.images`` writes what the pipeline called directly with the export loaded gives (fp32, 1e-5): the
same references, generators, size and default true-CFG settings.

The pipelines resize references to about 1024 x 1024 pixels (a function / constants of their diffusers
modules), far beyond a CPU test of the tiny pipelines: the areas are shrunk in those modules, read alike by
the run and the pipeline (both in this process), as in tests/families/test_qwen_image_edit_conditioning.py.
"""

import os

import pytest
import torch

from opendit_lite.diffusion.sampling_utils import SampleGenerators
from tests.families.test_qwen_image_edit_conditioning import small_areas  # noqa: F401  (a fixture)
from tests.pipeline_runs import write_image
from tests.video_scripts.test_family_scripts import main
from tests.video_scripts.test_lora_export import LoadLog
from tests.video_scripts.test_pipeline_sampling import script_clips

CAPTION = "make the square blue"
STEPS = 2
REFERENCES = {"qwenimage_edit": 1, "qwenimage_edit_plus": 2}


@pytest.mark.parametrize("name", list(REFERENCES))
def test_an_edit_lora_run_samples_with_its_references_what_its_pipeline_gives(name, tiny_pipeline, small_areas,  # noqa: F811
                                                                              tmp_path):
    from diffusers import DiffusionPipeline
    from PIL import Image

    from opendit_lite.sampling.pipeline_sampling import pipeline_pixels

    folder = tiny_pipeline(name)
    write_image(tmp_path / "target.png", 32, 32, seed=1)
    references = [write_image(tmp_path / f"reference{i}.png", 40, 56, seed=2 + i) for i in range(REFERENCES[name])]
    csv = tmp_path / "edits.csv"
    csv.write_text(f"path,text,image\ntarget.png,{CAPTION},{'|'.join(os.path.basename(r) for r in references)}\n")
    args = [f"model.pipeline={folder}", "data.type=csv", f"data.path={csv}", "data.image_size=32", "precision=fp32",
            "global_batch_size=1", "lr=5e-3", "ckpt_every=0", "lora.rank=4", "lora.alpha=4", "exp_name=edit",
            f"results_dir={tmp_path}", "logger=[]"]
    main("train", [*args, "max_steps=1"])  # one AdamW step moves the adapters off the no-op
    ours = script_clips("sample", [*args, f"sample.prompts={[CAPTION]}", f"sample.images={['|'.join(references)]}",
                                   f"sample.num_sampling_steps={STEPS}"])

    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    pictures = [Image.open(r).convert("RGB") for r in references]

    def direct():
        generators = SampleGenerators(0, range(1)).generators
        with torch.no_grad():
            return pipeline_pixels(pipe(prompt=[CAPTION], image=pictures[0] if len(pictures) == 1 else pictures,
                                        generator=generators, output_type="pt", height=32, width=32,
                                        num_inference_steps=STEPS)).float()

    base = direct()
    with LoadLog() as log:
        pipe.load_lora_weights(os.path.join(str(tmp_path), "edit", "diffusers"))
    assert not log.key_warnings(), log.text()
    reference = direct()
    assert ours.shape == reference.shape == (1, 3, 1, 32, 32)
    difference = (ours - reference).abs().max().item()
    print(f"\n{name}: sample.py vs the pipeline with the export: {difference:.2g}")
    assert difference <= 1e-5
    assert (reference - base).abs().max() > 1e-5  # the LoRA changes the samples
