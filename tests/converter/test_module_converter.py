"""The built-in conversions on real models: a converted model keeps its weights and state-dict keys
and gives the same outputs and gradients as the unconverted one; the report says what happened."""

import copy

import pytest
import torch
import torch.nn as nn

import opendit_lite.kernels.flash_attention as flash_module
from opendit_lite.converter import ConversionRegistry, ModuleConverter, register_builtin_conversions
from opendit_lite.kernels import (
    FlashAttentionOp,
    FusedGatedResidualNorm,
    FusedLayerNormModulate,
    TritonLayerNorm,
    flash_attn_version,
)
from opendit_lite.models import build_model
from opendit_lite.models.layers import Attention, LayerNormModulate, SDPAAttentionOp

ALL_ON = {"fused_adaln": True, "fused_layernorm": True, "attention_backend": "auto"}


def builtin_converter(config):
    """A converter with the built-in conversions only (other packages add theirs to the default
    registry when imported, and this file tests the built-ins)."""
    registry = ConversionRegistry()
    register_builtin_conversions(registry)
    return ModuleConverter(config, registry=registry)


class TinyVideoBlock(nn.Module):
    """Per-token modulation (as video models use), an affine LayerNorm and an affine-free one."""

    def __init__(self, dim=24, heads=3):
        super().__init__()
        self.norm = LayerNormModulate(dim)
        self.attn = Attention(dim, num_heads=heads)
        self.ln = nn.LayerNorm(dim)
        self.ln_plain = nn.LayerNorm(dim, elementwise_affine=False)
        self.mod = nn.Linear(dim, 2 * dim)

    def forward(self, x):                                   # x: [B, N, D]
        shift, scale = self.mod(x).chunk(2, dim=-1)         # 2 x [B, N, D]
        x = x + self.attn(self.norm(x, shift, scale))       # [B, N, D]
        return self.ln_plain(self.ln(x))                    # [B, N, D]


def randomize_(model):
    """DiT zero-initialises its adaLN and output layers; random weights make the comparison bite."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def outputs_and_grads(model, inputs):
    model.zero_grad()
    torch.manual_seed(0)  # DiT's label dropout (train mode) draws from the global generator
    out = model(*inputs)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def check_equivalent(model, inputs, converter):
    reference = copy.deepcopy(model)
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    params_before = dict(model.named_parameters())
    report = converter.convert(model)

    # Same keys, same values, and the very same Parameter objects (optimisers built before still apply).
    assert list(model.state_dict()) == list(state_before)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state_before[key]), key
    assert all(params_before[name] is p for name, p in model.named_parameters())

    out, grads = outputs_and_grads(model, inputs)
    ref_out, ref_grads = outputs_and_grads(reference, inputs)
    assert_relative_close(out, ref_out, "output")
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        assert_relative_close(grads[name], ref_grads[name], f"grad of {name}")
    return report


def assert_relative_close(actual, expected, what, tol=1e-5):
    """Relative error in norm. Through a whole model, fp32 rounding differs between the kernels and
    torch and is amplified by the layers (gradients of random-weight DiTs reach hundreds), so an
    elementwise atol does not fit; each side is within about 1e-5 of a float64 run."""
    error = ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()
    assert error < tol, f"{what}: relative error {error:.2e} >= {tol:.0e}"


def test_tiny_video_block_all_conversions():
    model = randomize_(TinyVideoBlock())
    report = check_equivalent(model, (torch.randn(3, 7, 24),), builtin_converter(ALL_ON))
    assert type(model.norm) is FusedLayerNormModulate
    assert type(model.ln) is TritonLayerNorm
    assert type(model.ln_plain) is nn.LayerNorm, "a LayerNorm without weight and bias is kept"
    expected_attention = FlashAttentionOp if flash_attn_version() else SDPAAttentionOp
    assert type(model.attn.attn_op) is expected_attention
    assert ("norm", LayerNormModulate, FusedLayerNormModulate) in report.replaced
    assert ("ln", nn.LayerNorm, TritonLayerNorm) in report.replaced


def test_dit_all_conversions_match_unconverted():
    model = randomize_(build_model("DiT-T/2", input_size=8, num_classes=10)).train()
    inputs = (torch.randn(3, 4, 8, 8), torch.tensor([1, 500, 999]), torch.tensor([0, 3, 9]))
    # The default registry, as training uses it (sequence parallelism is off without sp_size > 1).
    report = check_equivalent(model, inputs, ModuleConverter(ALL_ON))
    depth = len(model.blocks)
    # norm1 and norm2 (the attention residual + the MLP's norm) per block, plus the final layer's norm
    assert report.counts()["fused_adaln"] == 2 * depth + 1
    assert all(type(b.norm1) is FusedLayerNormModulate and type(b.norm2) is FusedGatedResidualNorm
               for b in model.blocks)
    assert type(model.final_layer.norm_final) is FusedLayerNormModulate


def test_report_text_and_defaults():
    model = TinyVideoBlock()
    report = builtin_converter(None).convert(model)         # no config: every conversion off
    assert report.replaced == [] and type(model.norm) is LayerNormModulate
    text = str(report)
    assert text.splitlines()[0] == "module converter: 0 of 3 conversions on, 0 modules replaced"
    assert "fused_adaln: off" in text and "fused_layernorm: off" in text
    assert "attention: sdpa (attention_backend=sdpa)" in text

    report = builtin_converter(ALL_ON).convert(model)
    text = str(report)
    assert "fused_adaln: on" in text and "1 x LayerNormModulate -> FusedLayerNormModulate" in text
    assert "1 x LayerNorm -> TritonLayerNorm" in text


def test_flash_backend_when_flash_attn_is_missing(monkeypatch):
    monkeypatch.setattr(flash_module, "flash_attn_version", lambda: None)
    model = TinyVideoBlock()
    report = builtin_converter({"attention_backend": "flash"}).convert(model)
    assert type(model.attn.attn_op) is SDPAAttentionOp
    assert "attention: sdpa (attention_backend=flash but flash-attn is not installed)" in str(report)


def test_flash_backend_when_flash_attn_is_present(monkeypatch):
    # Pretend flash-attn imports: the op is swapped; on CPU fp32 it still computes through SDPA.
    monkeypatch.setattr(flash_module, "flash_attn_version", lambda: "2.7.4")
    model = randomize_(TinyVideoBlock())
    report = check_equivalent(model, (torch.randn(2, 5, 24),), builtin_converter({"attention_backend": "flash"}))
    assert type(model.attn.attn_op) is FlashAttentionOp
    assert report.counts()["attention_backend"] == 1
    assert "attention: flash (flash-attn 2.7.4" in str(report)


def test_unknown_attention_backend_raises():
    with pytest.raises(ValueError, match="attention_backend='flsh' is not one of"):
        builtin_converter({"attention_backend": "flsh"}).convert(TinyVideoBlock())


def test_converting_twice_changes_nothing_more():
    model = TinyVideoBlock()
    builtin_converter(ALL_ON).convert(model)
    assert builtin_converter(ALL_ON).convert(model).replaced == []
