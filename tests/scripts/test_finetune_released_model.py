"""docs/finetune_released_model.md's path, end to end on tiny random pipelines: a released model's
pipeline folder, your captioned images (Flux) or clips (Wan), configs/flux_lora.yaml or
configs/wan_lora.yaml with the folder and the CSV given on the command line, a few LoRA steps, and the
exported transformer loaded into the family's own pipeline, which then generates. Flux trains through
train.py (the image script); Wan through train_video.py in this process and at sp_size=2 on two gloo
ranks under torchrun, with the one-process losses."""

import os

import numpy as np
import pytest
import torch

from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.pipeline_runs import write_clip, write_csv, write_image
from tests.video_scripts.test_family_scripts import main
from tests.video_scripts.test_video_scripts import losses, run

CAPTIONS = ("a red square moving left", "a blue disc moving up")
STEPS = ["max_steps=2", "global_batch_size=2", "log_every=1", "ckpt_every=0", "precision=fp32", "num_workers=0"]


def _generates(pipe, name: str) -> None:
    with torch.no_grad():
        out = pipe(CAPTIONS[0], output_type="pt", generator=torch.Generator().manual_seed(0), **TINY_CALLS[name])
    frames = out.images if hasattr(out, "images") else out.frames
    assert torch.isfinite(torch.as_tensor(np.asarray(frames))).all()


def test_flux_lora_from_its_pipeline_folder_with_train_py(tiny_pipeline, tmp_path, capsys):
    from diffusers import FluxPipeline, FluxTransformer2DModel

    from tests.video_scripts.test_family_scripts import exits_2

    folder = tiny_pipeline("flux")
    rows = [(write_image(tmp_path / f"{i}.png", 40, 48, seed=i), c) for i, c in enumerate(CAPTIONS)]
    csv = write_csv(tmp_path, rows)
    out = tmp_path / "runs"
    main("train", ["--config", "configs/flux_lora.yaml", f"model.pipeline={folder}", f"data.path={csv}",
                   "data.image_size=32", f"results_dir={out}", *STEPS])
    run_dir = out / "flux_lora"
    assert len(losses(str(run_dir))) == 2 and all(np.isfinite(losses(str(run_dir))))
    transformer = FluxTransformer2DModel.from_pretrained(str(run_dir / "diffusers"))
    _generates(FluxPipeline.from_pretrained(folder, transformer=transformer), "flux")
    capsys.readouterr()
    err = exits_2(capsys, "sample_video", ["--config", "configs/flux_lora.yaml", f"model.pipeline={folder}",
                                           f"data.path={csv}", "data.image_size=32", f"results_dir={out}"])
    assert "was trained from the pipeline folder" in err and "load the run's diffusers/ export" in err


@pytest.mark.slow  # two launches of torchrun's ranks: about a minute on 2 cores
def test_wan_lora_from_its_pipeline_folder_serial_and_sequence_parallel(tiny_pipeline, tmp_path):
    from diffusers import WanPipeline, WanTransformer3DModel

    folder = tiny_pipeline("wan")
    rows = [(os.path.basename(write_clip(tmp_path / f"{i}.mp4", 5, 40, 48, seed=i)), c) for i, c in enumerate(CAPTIONS)]
    csv = write_csv(tmp_path, rows)
    args = ["--config", "configs/wan_lora.yaml", f"model.pipeline={folder}", f"data.path={csv}", "data.num_frames=5",
            "data.image_size=32", *STEPS]
    main("train_video", [*args, f"results_dir={tmp_path / 'one'}"])
    run(["train_video.py", *args, "sp_size=2", f"results_dir={tmp_path / 'two'}"], torchrun=True)
    serial, parallel = losses(str(tmp_path / "one" / "wan_lora")), losses(str(tmp_path / "two" / "wan_lora"))
    assert len(serial) == 2 and np.allclose(serial, parallel, rtol=1e-4, atol=1e-6), (serial, parallel)
    transformer = WanTransformer3DModel.from_pretrained(str(tmp_path / "two" / "wan_lora" / "diffusers"))
    _generates(WanPipeline.from_pretrained(folder, transformer=transformer), "wan")


@pytest.mark.parametrize("config", ["configs/flux_lora.yaml", "configs/wan_lora.yaml"])
def test_the_configs_point_at_a_pipeline_folder_to_edit(config, capsys, tmp_path):
    from tests.video_scripts.test_family_scripts import exits_2

    csv = write_csv(tmp_path, [("a.png", "a caption")])
    err = exits_2(capsys, "train_video", ["--config", config, f"data.path={csv}"])
    assert "'model.pipeline' '/path/to/" in err and "is not a folder" in err
