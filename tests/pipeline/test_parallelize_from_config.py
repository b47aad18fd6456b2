"""``parallelize_from_config``: the one place a config's fields meet ``parallelize``. Every keyword
``parallelize`` takes from a config is passed from its field (a config with each field set to a
non-default value reaches the call and the report), and sampling's differences: no activation
checkpointing, ``sample.compile`` instead of ``compile``, no CUDA graphs."""

import inspect

import pytest
import torch.nn as nn

import opendit_lite.builders.parallelize as from_config
from opendit_lite import parallelize_from_config
from opendit_lite.config import TrainConfig
from opendit_lite.models import build_model
from opendit_lite.parallelization import parallelize

# parallelize keyword -> (config field, a value other than parallelize's default)
TRAINING = {
    "sp_mode": ("sp_mode", "dsp"),
    "sp_ring_size": ("sp_ring_size", 2),
    "fused_adaln": ("fused_adaln", True),
    "fused_layernorm": ("fused_layernorm", True),
    "attention_backend": ("attention_backend", "flash"),
    "selective_ratio": ("selective_ratio", 0.5),
    "ac_offload": ("ac_offload", True),
    "compile": ("compile", True),
    "cuda_graphs": ("cuda_graphs", True),
    "lora_rank": ("lora.rank", 4),
    "lora_alpha": ("lora.alpha", 8.0),
    "lora_dropout": ("lora.dropout", 0.1),
    "lora_targets": ("lora.targets", ["qkv"]),
    "base_precision": ("lora.base_precision", "fp8"),
    "blocks_to_swap": ("memory.blocks_to_swap", 1),
}
# The sampler loads a run's adapters merged: none are added, no base is stored low, no block swapped.
SAMPLING_NEVER = {"lora_rank": 0, "base_precision": "none", "blocks_to_swap": 0}
NOT_FROM_A_CONFIG = {"model", "sp_group", "compile_backend"}  # the caller's objects; no config field
DERIVED = {"sp_auto": None}  # sp_mode=auto's inputs, derived from the config's buckets (None for other modes)


def every_field_set() -> TrainConfig:
    cfg = TrainConfig()
    for field, value in TRAINING.values():
        owner, _, name = field.rpartition(".")
        setattr(getattr(cfg, owner) if owner else cfg, name, value)
    cfg.sample.compile = True
    return cfg


@pytest.fixture
def calls(monkeypatch):
    recorded = []
    monkeypatch.setattr(from_config, "parallelize", lambda model, **kwargs: recorded.append(kwargs))
    return recorded


def test_every_config_keyword_of_parallelize_is_covered():
    keywords = set(inspect.signature(parallelize).parameters) - NOT_FROM_A_CONFIG - set(DERIVED)
    assert keywords == set(TRAINING)
    defaults = {name: p.default for name, p in inspect.signature(parallelize).parameters.items()}
    assert all(value != defaults[name] for name, (_, value) in TRAINING.items())


def test_training_passes_every_field(calls):
    group = object()
    parallelize_from_config(nn.Linear(2, 2), every_field_set(), group)
    assert calls == [{"sp_group": group, **DERIVED, **{name: value for name, (_, value) in TRAINING.items()}}]


def test_sampling_keeps_kernels_and_sp_drops_checkpointing(calls):
    parallelize_from_config(nn.Linear(2, 2), every_field_set(), None, sampling=True)
    expected = {name: value for name, (_, value) in TRAINING.items() if not name.startswith("lora_")}
    expected.update(SAMPLING_NEVER, **DERIVED, sp_group=None, selective_ratio=1.0, ac_offload=False, compile=True,
                    cuda_graphs=False)
    assert calls == [expected]
    cfg = every_field_set()
    cfg.sample.compile = False
    parallelize_from_config(nn.Linear(2, 2), cfg, None, sampling=True)
    assert calls[-1]["compile"] is False  # sample.compile, not the training compile


def test_the_fields_reach_the_report():
    cfg = every_field_set()
    cfg.attention_backend = "sdpa"  # flash would only warn here: flash-attn is not installed
    model = build_model("DiT-T/2", input_size=8, num_classes=10)
    with pytest.warns(UserWarning, match="fused_layernorm was requested but matched nothing in DiT"):
        report = parallelize_from_config(model, cfg, None)  # DiT's norms are all adaLN ones
    rows = {row.step: row for row in report.rows}
    assert "FusedLayerNormModulate" in str(report) and report.count("kernels") > len(model.blocks)
    assert report.count("activation_checkpointing") == len(model.blocks) // 2
    assert "offloaded to CPU" in rows["activation_checkpointing"].swapped
    assert "CUDA graphs" in rows["compile"].swapped and report.count("compile") == len(model.blocks)

    cfg.fused_layernorm = False
    sampled = parallelize_from_config(build_model("DiT-T/2", input_size=8, num_classes=10), cfg, None, sampling=True)
    assert sampled.count("activation_checkpointing") == 0 and sampled.checkpointing is None
    assert "CUDA graphs" not in str(sampled) and sampled.count("compile") == len(model.blocks)
