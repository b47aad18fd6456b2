"""precision=fp8 and cuda_graphs: the refusals where they cannot run (CPU here), and the FP8 module
filter, which picks exactly the Linear layers of the blocks' attention and MLP."""

import types

import pytest
import torch
import torch.nn as nn

from opendit_lite.config import ConfigError, TrainConfig
from opendit_lite.config.loader import validate
from opendit_lite.models import build_model
from opendit_lite.parallelization import apply_compile
from opendit_lite.precision import check_fp8_supported, fp8_linear_names
from opendit_lite.training.cuda_graphs import check_cuda_graphs
from opendit_lite.training.loop import build_booster

CPU = torch.device("cpu")


def test_filter_picks_exactly_the_block_attention_and_mlp_linears():
    model = build_model("DiT-T/2", input_size=8, num_classes=10)
    expected = [f"blocks.{i}.{layer}" for i in range(len(model.blocks))
                for layer in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
    assert fp8_linear_names(model) == expected
    # what stays bf16: every adaLN modulation, the embedders' MLPs and the final layer
    others = {name for name, m in model.named_modules() if isinstance(m, nn.Linear)} - set(expected)
    assert others and all(("adaLN_modulation" in n or "embedder" in n or n.startswith("final_layer")) for n in others)


def test_filter_skips_linears_the_fp8_matmul_cannot_take():
    model = build_model("DiT-T/2", input_size=8, num_classes=10)
    model.blocks[0].attn.proj = nn.Linear(64, 60)          # 60 features: not a multiple of 16
    assert "blocks.0.attn.proj" not in fp8_linear_names(model)


def test_fp8_refused_on_cpu():
    with pytest.raises(ConfigError, match="precision=fp8 needs a CUDA GPU"):
        check_fp8_supported(CPU)


def test_fp8_refused_with_gemini():
    cfg = TrainConfig(precision="fp8", zero_degree=3)
    with pytest.raises(ConfigError, match="zero_degree 0, 1 and 2"):
        validate(cfg)


def test_cuda_graphs_refused_on_cpu_and_without_compile():
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        check_cuda_graphs(cuda_graphs=True, compile=True, device=CPU)
    with pytest.raises(ConfigError, match="set compile=true"):
        check_cuda_graphs(cuda_graphs=True, compile=False, device=torch.device("cuda"))
    check_cuda_graphs(cuda_graphs=False, compile=False, device=CPU)


def test_cuda_graphs_compile_the_blocks_in_reduce_overhead_mode(monkeypatch):
    calls = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kwargs: calls.append(kwargs))
    model = build_model("DiT-T/2", input_size=8, num_classes=10)
    rows = apply_compile(model, enabled=True, cuda_graphs=True)
    assert calls == [{"mode": "reduce-overhead"}] * len(model.blocks)
    assert "CUDA graphs" in rows[0].swapped


@pytest.mark.parametrize("overrides,match", [(dict(precision="fp8"), "precision=fp8"),
                                             (dict(cuda_graphs=True, compile=True), "cuda_graphs=true")])
def test_trainer_set_up_refuses_before_building_anything(overrides, match):
    # build_booster is the trainers' first step; train.py turns the ConfigError into exit code 2.
    info = types.SimpleNamespace(device=CPU, local_world_size=1)
    with pytest.raises(ConfigError, match=match):
        build_booster(TrainConfig(**overrides), info)


@pytest.mark.gpu
def test_fp8_converts_the_block_linears_on_a_capable_gpu():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need compute capability >= 8.9")
    pytest.importorskip("torchao.float8")
    from opendit_lite.precision import apply_fp8_training

    model = build_model("DiT-T/2", input_size=8, num_classes=10).cuda().to(torch.bfloat16)
    names = apply_fp8_training(model)
    converted = {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert converted == set(names)
    out = model(torch.randn(2, 4, 8, 8, device="cuda", dtype=torch.bfloat16),
                torch.tensor([1, 2], device="cuda"), torch.tensor([0, 1], device="cuda"))
    out.float().square().mean().backward()
