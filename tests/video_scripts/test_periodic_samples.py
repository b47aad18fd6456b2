"""``sample.every``: a LoRA run on the tiny Wan pipeline samples its prompts from the checkpoints it saves
at steps 2 and 4 into ``<run>/samples/step_<N>/`` (one clip per prompt and a contact sheet, the contact
sheet also to TensorBoard) through sample_video.py's own path (``sampling.video.sample_prompts``), and
the run's losses equal, bit for bit, those of the same run without sampling. Refused
with exit 2: a period that is not a multiple of ckpt_every, and no prompts."""

import json
import os

import pytest

from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.pipeline_runs import extracted_latents
from tests.video_scripts.test_family_scripts import exits_2, main
from tests.video_scripts.test_pipeline_sampling import run_args

PROMPTS = ["a red square moving right", "a blue disc"]


def _losses(results: str, name: str):
    with open(os.path.join(results, name, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if "loss" in r]


def test_a_run_samples_every_n_steps_and_trains_as_without_sampling(tiny_pipeline, tmp_path):
    pipeline, call = tiny_pipeline("wan"), TINY_CALLS["wan"]
    data = extracted_latents(pipeline, tmp_path, PROMPTS, frames=call["num_frames"], size=call["height"])
    common = ["max_steps=4", "ckpt_every=2", "log_every=1", "lora.rank=4", "lora.alpha=4",
              f"sample.prompts={PROMPTS}", "sample.num_sampling_steps=2"]
    results = str(tmp_path)
    main("train_video", [*run_args(pipeline, data, results, "plain"), *common])
    main("train_video", [*run_args(pipeline, data, results, "sampled"), *common, "sample.every=2",
                         "logger=[tensorboard]"])
    assert _losses(results, "sampled") == _losses(results, "plain")  # bit-identical training
    for step in (2, 4):
        files = sorted(os.listdir(os.path.join(results, "sampled", "samples", f"step_{step}")))
        assert "contact_sheet.png" in files and len([f for f in files if f.endswith((".mp4", ".gif"))]) == 2
    assert os.listdir(os.path.join(results, "sampled", "tensorboard"))
    with open(os.path.join(results, "sampled", "metrics.jsonl")) as f:
        assert [r["step"] for r in map(json.loads, f) if "sample/seconds" in r] == [2, 4]


@pytest.mark.parametrize("extra, message", [
    (["ckpt_every=3", "sample.every=2", "sample.prompts=[a]"], "must be a positive multiple of 'ckpt_every'"),
    (["ckpt_every=2", "sample.every=2"], "no prompts are given"),
])
def test_sample_every_that_cannot_apply_exits_2(tiny_pipeline, tmp_path, capsys, extra, message):
    pipeline = tiny_pipeline("wan")
    args = [f"model.pipeline={pipeline}", "data.type=csv", f"data.path={tmp_path}", f"results_dir={tmp_path}",
            "data.num_frames=5", "data.image_size=32", *extra]
    assert message in exits_2(capsys, "train_video", args)
