"""A released model of two experts (Wan 2.2 I2V-A14B, ``Release.experts``) plans without its folder as a
run of that folder trains it: both experts' weights held, one expert's activations per sample; the
shipped config carries what the planner prints for a 24 GB card (its header's command)."""

import os

import yaml

from opendit_lite.plan.__main__ import main as plan_main

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = "configs/wan_i2v_a14b_lora.yaml"


def test_wan22_i2v_a14b_plans_both_experts_from_the_release_and_its_config_carries_the_plan(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = ["--config", CONFIG, "--gpu-memory", "24", "--host-memory", "96", "model.pipeline=null",
            "model.expert=null", "model.path=/path/to/Wan2.2-I2V-A14B-Diffusers/transformer",
            "model.name=WanTransformer3DModel", "data.type=latents", "data.path=/path/to/latents", "data.buckets=null",
            "data.num_frames=21", "data.image_size=640", "text_encoder.max_length=512"]
    assert plan_main(argv) == 0
    out = capsys.readouterr().out
    assert "Wan-AI/Wan2.2-I2V-A14B-Diffusers transformer config" in out and "2 experts of it" in out
    # 80 blocks: both experts' 40 (one expert alone would have 40 to swap)
    assert "of 80 blocks' frozen weights in host memory" in out
    fragment = yaml.safe_load(out[out.index("# python -m opendit_lite.plan:"):])
    with open(CONFIG) as f:
        shipped = yaml.safe_load(f)
    for key, value in fragment.items():
        if isinstance(value, dict):
            assert all(shipped[key][k] == v for k, v in value.items()), (key, value)
        else:
            assert shipped[key] == value, (key, value)
    assert float(out.split("# predicted peak ")[1].split(" GiB")[0]) <= 24 * 0.9 - 1
