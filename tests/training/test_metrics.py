"""Metric sinks: the same scalars reach metrics.jsonl, TensorBoard and W&B (a stand-in module
recording its calls); W&B runs offline unless WANDB_MODE is set; asking for W&B without the
package is a ConfigError (exit code 2 in the scripts)."""

import importlib.machinery
import json
import os
import sys
import types

import pytest
import torch

from opendit_lite.config import ConfigError
from opendit_lite.training.telemetry import MetricsLogger

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeRun:
    def __init__(self, calls):
        self.calls = calls

    def log(self, values, step):
        self.calls.append(("log", dict(values), step))

    def finish(self):
        self.calls.append(("finish",))


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = []
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    module.init = lambda **kwargs: calls.append(("init", kwargs)) or FakeRun(calls)
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return calls


def test_same_scalars_in_every_sink(tmp_path, fake_wandb):
    log = MetricsLogger(str(tmp_path), enabled=True, loggers=["tensorboard", "wandb"], run_name="demo",
                        config={"lr": 1e-3})
    assert os.environ["WANDB_MODE"] == "offline"
    assert fake_wandb[0] == ("init", dict(project="opendit_lite", name="demo", dir=str(tmp_path),
                                          config={"lr": 1e-3}, resume="allow"))
    log.start(0, 4)
    values = log.log(4, {"loss": torch.tensor(2.0)}, count=4, samples_per_step=8,
                     extra={"lr": 1e-3, "grad_norm": 0.5, "mem_gib": 1.0, "absent": None},
                     flops_per_step=2e12, peak_tflops=100.0)
    log.close()
    assert values["loss"] == 0.5 and "absent" not in values
    assert values["tflops"] == pytest.approx(2.0 * values["samples_per_sec"] / 8)  # 2 TFLOP per step
    assert values["mfu"] == pytest.approx(values["tflops"] / 100.0)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert {k: record[k] for k in values} == values
    assert fake_wandb[1] == ("log", values, 4) and fake_wandb[-1] == ("finish",)
    assert any((tmp_path / "tensorboard").iterdir())


def test_wandb_mode_set_by_the_user_is_kept(tmp_path, fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    MetricsLogger(str(tmp_path), enabled=True, loggers=["wandb"]).close()
    assert os.environ["WANDB_MODE"] == "online"


def test_wandb_requested_but_missing_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails, as when not installed
    with pytest.raises(ConfigError, match="pip install wandb"):
        MetricsLogger(str(tmp_path), enabled=False, loggers=["wandb"])  # every rank checks


@pytest.mark.parametrize("override, expected", [
    ("logger=[tensorboard,mlflow]", "the metric sinks are tensorboard, wandb"),
    ("lr_schedule=step", "'lr_schedule' must be one of"),
    ("min_lr_ratio=1.5", "'min_lr_ratio' must lie in [0, 1]"),
    ("lora.rank=4 zero_degree=3", "use zero_degree=2"),
])
def test_new_fields_are_validated(override, expected):
    from opendit_lite.config import load_config, validate

    with pytest.raises(ConfigError) as err:
        validate(load_config(os.path.join(ROOT, "configs", "demo.yaml"), override.split()))
    assert expected in str(err.value)
