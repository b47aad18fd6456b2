"""A pipeline whose scheduler stretches its schedule to ``shift_terminal`` (Qwen-Image's, LTX-Video's) cannot
sample in one step: diffusers' ``stretch_shift_to_terminal`` divides ``1 - sigma`` by its last value, 0 when
the only sigma is 1, so the pipeline called directly gives NaN (Qwen-Image) or fails (LTX-Video).
``sample.num_sampling_steps=1`` for such a run is refused before anything is loaded (exit 2 from the
scripts); two steps sample."""

import pytest
import torch

from opendit_lite.errors import ConfigError


def _settings(folder: str, steps: int) -> dict:
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.sampling.pipeline_sampling import pipeline_call_settings

    cfg = load_config(None, [f"model.pipeline={folder}", "data.image_size=32", "data.num_frames=1",
                             f"sample.num_sampling_steps={steps}"], schema=VideoTrainConfig)
    return pipeline_call_settings(cfg)


def test_one_step_through_a_scheduler_stretched_to_its_terminal_is_refused(tiny_pipeline):
    from opendit_lite.families.tiny_pipelines import TINY_CALLS, build_tiny_pipeline

    pipe = build_tiny_pipeline("qwenimage")
    assert pipe.scheduler.config.shift_terminal
    with torch.no_grad():  # the reference: the pipeline's own one-step sample
        out = pipe(prompt="a red square", output_type="pt", generator=torch.Generator().manual_seed(0),
                   **dict(TINY_CALLS["qwenimage"], num_inference_steps=1))
    assert torch.isnan(out.images).any()
    folder = tiny_pipeline("qwenimage")
    with pytest.raises(ConfigError, match=r"sample.num_sampling_steps=1.*shift_terminal=0.02.*=2 or more"):
        _settings(folder, 1)
    assert _settings(folder, 2)["num_inference_steps"] == 2
