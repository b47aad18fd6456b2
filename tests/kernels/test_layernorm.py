"""Triton LayerNorm with affine: output, dx, dweight and dbias against ``reference_layer_norm``;
the choice of fused LayerNorm (apex / Triton / none). ``reference_layer_norm`` is also the eager
baseline of benchmarks/bench_layernorm.py.
"""

import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import opendit_lite.kernels.layernorm as layernorm_module
from opendit_lite.kernels import TritonLayerNorm, fused_layernorm_provider, to_fused_layernorm, triton_layer_norm
from tests.kernels.helpers import DEVICE, assert_close

EPS = 1e-5


def reference_layer_norm(x, weight, bias, eps=EPS):
    """LayerNorm over the last axis with elementwise weight and bias."""
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def make_inputs(shape, dtype, param_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    D = shape[-1]
    x = torch.randn(shape, generator=gen) * 2 + 0.5
    weight = 1 + 0.5 * torch.randn(D, generator=gen)
    bias = 0.5 * torch.randn(D, generator=gen)
    dy = torch.randn(shape, generator=gen)
    param_dtype = param_dtype or dtype
    return x.to(DEVICE, dtype), weight.to(DEVICE, param_dtype), bias.to(DEVICE, param_dtype), dy.to(DEVICE)


def run(fn, x, weight, bias, dy):
    x, weight, bias = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
    y = fn(x, weight, bias)
    y.backward(dy.to(y.dtype))
    return y.detach(), x.grad, weight.grad, bias.grad


def check_against_reference(x, weight, bias, dy):
    got = run(lambda a, w, b: triton_layer_norm(a, w, b, EPS), x, weight, bias, dy)
    expected = run(reference_layer_norm, x.double(), weight.double(), bias.double(), dy.to(x.dtype).double())
    assert got[0].dtype == x.dtype, "the output keeps the input's dtype, as torch's LayerNorm does"
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), got, expected):
        assert_close(a, e, f"{what} for x {tuple(x.shape)}, weight {weight.dtype}")


@pytest.mark.parametrize("B,N,D", list(itertools.product([1, 3], [1, 7, 33], [24, 40, 96])))
def test_fp32_shapes(B, N, D):
    check_against_reference(*make_inputs((B, N, D), torch.float32))


@pytest.mark.parametrize("shape", [(5, 40), (2, 3, 4, 24), (2, 3, 1152)])
def test_other_ranks_and_dit_xl_width(shape):
    check_against_reference(*make_inputs(shape, torch.float32))


@pytest.mark.parametrize("dtype,param_dtype", [
    (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
])
@pytest.mark.parametrize("shape", [(3, 7, 40), (1, 33, 96)])
def test_low_precision(shape, dtype, param_dtype):
    check_against_reference(*make_inputs(shape, dtype, param_dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_fallback_matches_reference(monkeypatch, dtype):
    monkeypatch.setattr(layernorm_module, "triton_runs_on", lambda x: False)
    check_against_reference(*make_inputs((3, 7, 40), dtype))


def test_module_is_a_drop_in_for_nn_layernorm():
    torch.manual_seed(0)
    ref = nn.LayerNorm(40, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        ref.weight.normal_(1, 0.5)
        ref.bias.normal_(0, 0.5)
    fused = to_fused_layernorm(ref, provider="triton")
    assert isinstance(fused, TritonLayerNorm) and isinstance(fused, nn.LayerNorm)
    assert fused.weight is ref.weight and fused.bias is ref.bias, "parameters are shared, not copied"
    assert fused.eps == ref.eps and fused.normalized_shape == ref.normalized_shape
    assert list(fused.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    x, _, _, dy = make_inputs((3, 7, 40), torch.float32)
    assert_close(fused(x), ref(x).detach().double(), "TritonLayerNorm vs nn.LayerNorm")


@pytest.mark.parametrize("module", [
    nn.LayerNorm(8, elementwise_affine=False), nn.LayerNorm(8, bias=False), nn.LayerNorm((4, 8)),
], ids=["no-affine", "no-bias", "2d-shape"])
def test_unsupported_layernorms_are_kept(module):
    assert to_fused_layernorm(module, provider="triton") is module


def test_provider_torch_keeps_the_module():
    module = nn.LayerNorm(8)
    assert to_fused_layernorm(module, provider="torch") is module


def test_unknown_provider_raises():
    with pytest.raises(ValueError, match="unknown fused LayerNorm provider"):
        to_fused_layernorm(nn.LayerNorm(8), provider="cudnn")


def test_provider_choice_follows_what_imports(monkeypatch):
    monkeypatch.setattr(layernorm_module, "_apex_fused_layernorm_cls", lambda: None)
    monkeypatch.setattr(layernorm_module, "triton_unavailable_reason", lambda: None)
    assert fused_layernorm_provider()[0] == "triton"
    monkeypatch.setattr(layernorm_module, "triton_unavailable_reason", lambda: "triton is not installed")
    provider, reason = fused_layernorm_provider()
    assert provider == "torch" and "triton is not installed" in reason
    monkeypatch.setattr(layernorm_module, "_apex_fused_layernorm_cls", lambda: nn.LayerNorm)
    assert fused_layernorm_provider()[0] == "apex"


def test_bad_parameter_shape_raises():
    with pytest.raises(ValueError, match="must both be"):
        triton_layer_norm(torch.zeros(2, 8), torch.ones(4), torch.zeros(8))


@pytest.mark.gpu
def test_apex_fused_layernorm_matches_reference():
    pytest.importorskip("apex.normalization", reason="apex is not installed (optional: NVIDIA/apex with --cuda_ext)")
    x, weight, bias, dy = make_inputs((3, 33, 96), torch.float32)
    ref = nn.LayerNorm(96, eps=EPS).to(DEVICE)
    with torch.no_grad():
        ref.weight.copy_(weight)
        ref.bias.copy_(bias)
    fused = to_fused_layernorm(ref, provider="apex")
    assert type(fused).__name__ == "FusedLayerNorm" and fused.weight is ref.weight and fused.bias is ref.bias

    x_leaf = x.detach().clone().requires_grad_()
    y = fused(x_leaf)
    y.backward(dy)
    expected = run(reference_layer_norm, x.double(), weight.double(), bias.double(), dy.double())
    got = (y.detach(), x_leaf.grad, fused.weight.grad, fused.bias.grad)
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), got, expected):
        assert_close(a, e, f"apex {what}")
