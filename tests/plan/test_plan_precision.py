"""The planner takes the precision resolved as a run resolves it: ``auto`` (the default), ``fp8`` and
``tf32`` plan without error, each with the bytes per activation element of what it trains in."""

import pytest

from opendit_lite.config import load_config
from opendit_lite.config.video_schema import VideoTrainConfig
from opendit_lite.plan import plan_config, plan_precision
from opendit_lite.plan.__main__ import main as plan_main
from opendit_lite.precision import resolve_precision

VIDEO = "configs/video_stdit_demo.yaml"


@pytest.mark.parametrize("config", [VIDEO, "configs/demo.yaml"])
@pytest.mark.parametrize("precision, shown", [("auto", "precision bf16 (auto on a GPU)"), ("fp8", "precision fp8"),
                                              ("tf32", "precision tf32")])
def test_plan_command_takes_every_precision(capsys, config, precision, shown):
    assert plan_main(["--config", config, "--gpu-memory", "80", f"precision={precision}"]) == 0
    out = capsys.readouterr().out
    assert shown in out and "assumptions" in out


def test_planned_bytes_follow_what_each_precision_trains_in():
    cfg = load_config(VIDEO, [], schema=VideoTrainConfig)
    batches = {}
    for name in ("fp32", "tf32", "bf16", "fp8"):
        cfg.precision = name
        result, _, _ = plan_config(cfg, 0.05, 1, fixed=True, reserve_gib=0)
        batches[name] = result.batches
        element = 4 if name in ("fp32", "tf32") else 2
        assert f"activations in {element}-byte elements" in result.assumptions[1]
    assert batches["tf32"] == batches["fp32"] and batches["fp8"] == batches["bf16"]
    assert all(batches["bf16"][b] > batches["fp32"][b] for b in batches["fp32"])
    cfg.precision = "auto"
    assert plan_precision(cfg).name == "bf16"  # a plan without a run sizes a GPU
    cpu_run = resolve_precision("auto", "cpu")  # what a CPU run resolves and hands to bucket_batch=auto
    assert plan_config(cfg, 0.05, 1, fixed=True, reserve_gib=0, precision=cpu_run)[0].batches == batches["fp32"]
