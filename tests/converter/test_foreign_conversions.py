"""Fused AdaLN and the attention adapters on models written outside the zoo, against the same
model unconverted: outputs and every parameter gradient (fp32, 1e-5; the kernels under Triton's
interpreter, which conftest switches on).

The converter adapts foreign attention only when flash-attn will be swapped in (absent here), so
the adapted forwards are checked through ``adapt_foreign_attention``, what sequence parallelism
runs first; with flash-attn installed the converter test counts the adapters too."""

import copy

import pytest
import torch.nn as nn

from opendit_lite.converter import AdaLNLayerNorm, ModuleConverter
from opendit_lite.converter.attention_adapters import OpAttnProcessor, OpCrossAttnProcessor
from opendit_lite.kernels import flash_attn_version
from opendit_lite.models.layers.attention import SDPAAttentionOp
from opendit_lite.parallel.foreign_attention import adapt_foreign_attention
from tests import foreign_models as fm

TOL = 1e-5
CONFIG = dict(fused_adaln=True, attention_backend="auto")


def _run(model, inputs):
    args, kwargs = (inputs, {}) if isinstance(inputs, tuple) else ((), inputs)
    out = model(*args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    (out.float() ** 2).mean().backward()
    return out.detach()


def check_same(reference: nn.Module, converted: nn.Module, inputs) -> None:
    expected, got = _run(reference, inputs), _run(converted, inputs)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOL
    ref_params = dict(reference.named_parameters())
    assert set(ref_params) == set(dict(converted.named_parameters()))
    assert reference.state_dict().keys() == converted.state_dict().keys()
    for name, p in converted.named_parameters():
        if not p.requires_grad:
            continue
        assert p.grad is not None, name
        assert ref_params[name].grad.abs().max() > 0, f"{name} has no gradient to compare"
        err = (p.grad - ref_params[name].grad).abs().max().item()
        assert err < TOL, f"{name}: gradient differs by {err}"


def convert(model):
    """Fused AdaLN and the attention backend through the converter, then the attention adapters."""
    converted = copy.deepcopy(model)
    report = ModuleConverter(**CONFIG).convert(converted)
    adapt_foreign_attention(converted)
    return converted, report


def flash_swaps(report) -> int:
    """attention_backend replacements expected: none unless flash-attn is in use."""
    return report.counts()["attention_backend"] if flash_attn_version() is not None else 0


def test_meta_dit_blocks_and_final_layer_get_fused_adaln_and_attn_op():
    model = fm.meta_dit()
    converted, report = convert(model)
    counts = report.counts()
    assert counts["fused_adaln"] >= 3 * 2 + 2  # per block: class + 2 norms; final layer: class + norm
    assert counts["attention_backend"] == flash_swaps(report)
    block = converted.blocks[0]
    assert isinstance(block, fm.DiTBlock) and type(block).__name__ == "FusedAdaLNDiTBlock"
    assert isinstance(block.norm1, AdaLNLayerNorm) and isinstance(converted.final_layer.norm_final, AdaLNLayerNorm)
    assert isinstance(block.attn.attn_op, SDPAAttentionOp) and type(block.attn).__name__ == "OpAttention"
    assert "fused_adaln: on" in str(report) and "DiTBlock -> FusedAdaLNDiTBlock" in str(report)
    check_same(model, converted, fm.meta_dit_inputs())
    # Meta's checkpoints load into the converted model as they are.
    converted.load_state_dict(model.state_dict())


def test_diffusers_dit_blocks_get_fused_adaln_and_attention_processor():
    model = fm.tiny_diffusers_dit()
    converted, report = convert(model)
    counts = report.counts()
    assert counts["fused_adaln"] == 2 * 2  # per block: class + norm3 (norm1.norm is one level down)
    assert counts["attention_backend"] == flash_swaps(report)
    block = converted.transformer_blocks[0]
    assert type(block).__name__ == "FusedAdaLNBasicTransformerBlock"
    assert isinstance(block.norm1.norm, AdaLNLayerNorm) and isinstance(block.norm3, AdaLNLayerNorm)
    assert type(block.attn1.processor) is OpAttnProcessor
    check_same(model, converted, fm.diffusers_dit_inputs())


def test_pixart_blocks_get_fused_adaln_and_self_and_cross_processors():
    model = fm.tiny_pixart()
    converted, report = convert(model)
    counts = report.counts()
    assert counts["fused_adaln"] == 3 * 2 and counts["attention_backend"] == flash_swaps(report)
    block = converted.transformer_blocks[0]
    assert isinstance(block.norm1, AdaLNLayerNorm) and isinstance(block.norm2, AdaLNLayerNorm)
    assert type(block.attn1.processor) is OpAttnProcessor and type(block.attn2.processor) is OpCrossAttnProcessor
    check_same(model, converted, fm.pixart_inputs())


def test_user_block_protocol_gets_fused_adaln():
    model = fm.user_dit()
    converted, report = convert(model)
    assert report.counts()["fused_adaln"] == 2 * 2
    assert isinstance(converted.blocks[1].norm2, AdaLNLayerNorm)
    check_same(model, converted, fm.user_dit_inputs())


def test_fused_adaln_off_and_sdpa_leave_foreign_models_alone():
    model = fm.meta_dit()
    converted = copy.deepcopy(model)
    report = ModuleConverter(attention_backend="sdpa").convert(converted)
    assert report.counts()["fused_adaln"] == 0 and report.counts()["attention_backend"] == 0
    assert type(converted.blocks[0]) is fm.DiTBlock


def test_a_block_that_differs_from_meta_dit_is_not_matched():
    class WiderBlock(fm.DiTBlock):  # an extra child: not Meta's structure, so its forward is unknown
        def __init__(self):
            super().__init__(fm.HIDDEN, fm.HEADS)
            self.extra = nn.Linear(fm.HIDDEN, fm.HIDDEN)

    holder = nn.Sequential(WiderBlock())
    report = ModuleConverter(fused_adaln=True).convert(holder)
    assert report.counts()["fused_adaln"] == 0 and type(holder[0]) is WiderBlock


def test_protocol_naming_an_affine_layernorm_is_an_error():
    class Bad(fm.UserBlock):
        def __init__(self):
            super().__init__(fm.HIDDEN, fm.HEADS)
            self.norm1 = nn.LayerNorm(fm.HIDDEN)  # has weight and bias: not an adaLN norm

    with pytest.raises(TypeError, match="Bad.adaln_norms names 'norm1'.*affine-free"):
        ModuleConverter(fused_adaln=True).convert(nn.Sequential(Bad()))


def test_attention_adapters_run_as_a_conversion_when_flash_is_swapped_in(capsys):
    """The adapter conversion (forced on in a registry of its own) reports each adapted module, and
    a module it cannot adapt keeps its attention with a warning."""
    from timm.models.vision_transformer import Attention

    from opendit_lite.converter import ConversionRegistry
    from opendit_lite.converter.attention_adapters import _adapt, attention_adapter

    registry = ConversionRegistry()
    registry.register(nn.Module, _adapt, name="attention_backend", include_subclasses=True,
                      when=lambda m: attention_adapter(m) is not None)
    model = fm.tiny_pixart()
    report = ModuleConverter(registry=registry).convert(model)
    assert report.counts()["attention_backend"] == 4
    assert "2 x AttnProcessor2_0 -> OpAttnProcessor" in str(report)
    holder = nn.Sequential(Attention(fm.HIDDEN, num_heads=fm.HEADS),
                           Attention(fm.HIDDEN, num_heads=fm.HEADS, attn_drop=0.1))
    report = ModuleConverter(registry=registry).convert(holder)
    assert report.counts()["attention_backend"] == 1 and type(holder[1]) is Attention
    assert "Attention -> OpAttention" in str(report)
    assert "attention dropout p=0.1" in capsys.readouterr().err


def test_parallelize_converts_meta_dit_without_warnings():
    import warnings

    from opendit_lite.parallelization import parallelize

    model = fm.meta_dit()
    converted = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a requested swap that matched nothing would warn
        report = parallelize(converted, fused_adaln=True, attention_backend="auto")
    assert report.conversion.counts()["fused_adaln"] > 0
    assert report.conversion.counts()["attention_backend"] == flash_swaps(report.conversion)
    check_same(model, converted, fm.meta_dit_inputs())
