"""The planner counts a distillation's networks: two LoRA adapters (student and critic) on one frozen
base, or three copies of the model (the teacher frozen); a pipeline's distillation it plans with ZeRO-1/2
as a fine-tune, its base as loaded (lora.base_precision is not supported there yet)."""

import os

from opendit_lite.config import load_config
from opendit_lite.config.video_schema import VideoTrainConfig
from opendit_lite.plan import plan_config

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _plan(config, *overrides, schema=None):
    cfg = load_config(os.path.join(ROOT, "configs", config), list(overrides), **({"schema": schema} if schema else {}))
    result, _, _ = plan_config(cfg, memory_gib=80, world_size=2)
    return result.costs.weights, result.setting


def test_distillation_counts_both_networks(tiny_pipeline, tmp_path):
    plain, _ = _plan("demo_distill.yaml", "distill.teacher=null")
    full, _ = _plan("demo_distill.yaml")
    assert (full.trainable, full.outside) == (2 * plain.trainable, plain.outside + plain.trainable)
    lora, _ = _plan("demo_distill.yaml", "distill.teacher=null", "lora.rank=8")
    lora_distill, _ = _plan("demo_distill.yaml", "lora.rank=8")
    assert lora_distill.trainable == 2 * lora.trainable and lora_distill.block_linear == lora.block_linear
    folder, csv = tiny_pipeline("wan"), tmp_path / "clips.csv"
    csv.write_text("path,text\n")
    pipeline = [f"model.pipeline={folder}", f"data.path={csv}", "data.num_frames=5", "data.image_size=32"]
    _, fine_tune = _plan("wan_distill_lora.yaml", *pipeline, "distill.teacher=null", schema=VideoTrainConfig)
    _, distill = _plan("wan_distill_lora.yaml", *pipeline, f"distill.teacher={folder}", schema=VideoTrainConfig)
    assert fine_tune.zero_degree != 0 and distill.zero_degree in (1, 2) and distill.base_precision == "none"
