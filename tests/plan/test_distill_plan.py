"""The planner counts a distillation's networks: two LoRA adapters (student and critic) on one frozen
base, or three copies of the model (the teacher frozen), and plans it without ZeRO or SP, which
distillation does not run with yet."""

import os

from opendit_lite.config import load_config
from opendit_lite.plan import plan_config

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _weights(*overrides):
    cfg = load_config(os.path.join(ROOT, "configs", "demo_distill.yaml"), list(overrides))
    result, _, _ = plan_config(cfg, memory_gib=80, world_size=2)
    return result.costs.weights, result.setting


def test_distillation_counts_both_networks_and_plans_without_zero_or_sp():
    plain, _ = _weights("distill.teacher=null")
    full, setting = _weights()
    assert (full.trainable, full.outside) == (2 * plain.trainable, plain.outside + plain.trainable)
    assert (setting.zero_degree, setting.sp_size) == (0, 1)
    lora, _ = _weights("distill.teacher=null", "lora.rank=8")
    lora_distill, setting = _weights("lora.rank=8")
    assert lora_distill.trainable == 2 * lora.trainable and lora_distill.block_linear == lora.block_linear
    assert (setting.zero_degree, setting.sp_size) == (0, 1)
