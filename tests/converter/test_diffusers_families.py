"""Fused AdaLN on the diffusers families trained today, each against the same model unconverted:
the output and every parameter's gradient (fp32, 1e-5), through the Triton kernels (Triton's
interpreter on CPU, which conftest switches on) and through the kernels' torch path; the
state-dict keys stay diffusers'; the parallelize report says per family what was fused and what
was left, and a family whose modulation matches no kernel (LTX-Video) gets a warning with the reason.
"""

import copy
import warnings

import pytest
import torch

import opendit_lite.kernels.adaln as adaln_kernel
import opendit_lite.kernels.gated_residual as residual_kernel
from opendit_lite.converter import AdaLNLayerNorm, ModuleConverter, adaln_model_notes
from opendit_lite.parallelization import parallelize
from tests import diffusers_families as families

TOL = 1e-5

# model -> the fused classes the conversion must leave in it (class-swapped modules are named
# "FusedAdaLN" + diffusers' class name).
EXPECTED = {
    "WanTransformer3DModel": {"WanTransformerBlock"},
    "Wan2.2-per-token": {"WanTransformerBlock"},
    "FluxTransformer2DModel": {"FluxTransformerBlock", "AdaLayerNormZero", "AdaLayerNormZeroSingle",
                               "AdaLayerNormContinuous"},
    "SD3Transformer2DModel": {"JointTransformerBlock", "AdaLayerNormZero", "AdaLayerNormContinuous"},
    "SD3.5-dual-attention": {"JointTransformerBlock", "AdaLayerNormZero", "SD35AdaLayerNormZeroX",
                             "AdaLayerNormContinuous"},
    "CogVideoXTransformer3DModel": {"CogVideoXBlock", "CogVideoXLayerNormZero", "AdaLayerNorm"},
    "CogVideoX1.5": {"CogVideoXBlock", "CogVideoXLayerNormZero", "AdaLayerNorm"},
    "HunyuanVideoTransformer3DModel": {"HunyuanVideoTransformerBlock", "AdaLayerNormZero",
                                       "AdaLayerNormZeroSingle", "AdaLayerNormContinuous"},
    "Flux2Transformer2DModel": {"Flux2TransformerBlock", "Flux2SingleTransformerBlock", "AdaLayerNormContinuous"},
    "HunyuanVideo15Transformer3DModel": {"HunyuanVideo15TransformerBlock", "AdaLayerNormZero",
                                         "AdaLayerNormContinuous"},
}


def gradients(model, inputs):
    model.zero_grad()
    loss = families.loss(model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def fused_classes(model):
    return {type(m).__name__[len("FusedAdaLN"):] for m in model.modules() if type(m).__name__.startswith("FusedAdaLN")}


def use_kernel_path(path, monkeypatch):
    """Run the fused modules through the Triton kernels (where they run) or force the torch path."""
    if path == "triton":
        if not adaln_kernel.triton_runs_on(torch.zeros(1)):
            pytest.skip("the Triton kernels do not run on CPU tensors here (TRITON_INTERPRET is not set)")
    else:
        monkeypatch.setattr(adaln_kernel, "triton_runs_on", lambda x: False)
        monkeypatch.setattr(residual_kernel, "triton_runs_on", lambda x: False)


# Every model through the Triton kernels; the base families also through the kernels' torch path
# (the variants exercise other branches of the same forwards, not other kernel code). HunyuanVideo 1.5's
# blocks bind the kernels as Flux's and HunyuanVideo's do: the torch path only (the interpreter measured the
# same, for several seconds of CPU more).
TORCH_PATH_ONLY = ("HunyuanVideo15Transformer3DModel",)
CASES = [(name, "triton") for name in EXPECTED if name not in TORCH_PATH_ONLY] + [
    (name, "torch") for name in EXPECTED if name not in families.VARIANTS]


@pytest.mark.parametrize("name,kernel_path", CASES)
def test_converted_family_equals_unconverted(name, kernel_path, monkeypatch):
    use_kernel_path(kernel_path, monkeypatch)
    model = families.build(name)
    converted = copy.deepcopy(model)
    report = ModuleConverter(fused_adaln=True).convert(converted)
    assert fused_classes(converted) == EXPECTED[name]
    assert report.counts()["fused_adaln"] > 0
    assert converted.state_dict().keys() == model.state_dict().keys()
    converted.load_state_dict(model.state_dict())  # diffusers' checkpoints load as they are

    inputs = families.forward_inputs(name)
    ref_loss, ref_grads = gradients(model, inputs)
    loss, grads = gradients(converted, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=TOL, atol=TOL)
    with torch.no_grad():
        torch.testing.assert_close(families.output(converted, inputs), families.output(model, inputs),
                                   rtol=TOL, atol=TOL)
    assert grads.keys() == ref_grads.keys()
    for key, grad in grads.items():
        err = (grad - ref_grads[key]).abs().max().item()
        bound = TOL * max(1.0, ref_grads[key].abs().max().item())
        assert err < bound, f"{name} ({kernel_path}): the gradient of {key} differs by {err}"


@pytest.mark.parametrize("name", ["FluxTransformer2DModel", "CogVideoXTransformer3DModel", "Wan2.2-per-token"])
def test_bf16_converted_family_stays_within_bf16_rounding(name):
    """In bf16 the fused kernels round once where diffusers rounds after each op: the outputs agree
    to bf16's precision (the fused ones are the more exact, compared with an fp32 run)."""
    model = families.build(name)
    converted = copy.deepcopy(model)
    ModuleConverter(fused_adaln=True).convert(converted)
    inputs = families.forward_inputs(name)
    with torch.no_grad():
        exact = families.output(model, inputs)
        fused = families.output(converted.to(torch.bfloat16), _to_bf16(inputs)).float()
        unfused = families.output(model.to(torch.bfloat16), _to_bf16(inputs)).float()
    scale = exact.abs().max().item()
    assert (fused - exact).abs().max().item() <= max(2e-2 * scale, 1.5 * (unfused - exact).abs().max().item())


def _to_bf16(inputs):
    return {k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() and k != "timestep" else v
            for k, v in inputs.items()}


def test_cogvideox_affine_norm_keeps_its_parameters():
    """CogVideoX's norms carry weight and bias: the fused norm holds the same Parameter objects."""
    model = families.build("CogVideoXTransformer3DModel")
    norm = model.transformer_blocks[0].norm1.norm
    weight, bias = norm.weight, norm.bias
    ModuleConverter(fused_adaln=True).convert(model)
    fused = model.transformer_blocks[0].norm1.norm
    assert isinstance(fused, AdaLNLayerNorm) and fused.weight is weight and fused.bias is bias


# The families whose blocks' norms no fused kernel takes (their fused_norms.py says why).
NOTHING_FUSED = {"LTXVideoTransformer3DModel": "LTXVideoTransformerBlock",
                 "ZImageTransformer2DModel": "ZImageTransformerBlock"}


@pytest.mark.parametrize("name", [n for n in families.FAMILIES if n not in NOTHING_FUSED])
def test_parallelize_reports_what_was_fused_and_left(name):
    model = families.build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing requested is left silently here
        report = parallelize(model, fused_adaln=True)
    notes = adaln_model_notes(model)
    row = next(r for r in report.rows if r.swapped.startswith("fused_adaln"))
    assert row.swapped == f"fused_adaln in {name}: {notes.fused}" and row.count > 0
    assert all(reason in row.left for reason in notes.left) and notes.left
    text = " ".join(str(report).split())
    assert f"fused_adaln in {name}" in text


@pytest.mark.parametrize("name", sorted(NOTHING_FUSED))
def test_a_family_whose_norms_match_no_kernel_fuses_nothing_and_says_why(name):
    model = families.build(name)
    before = copy.deepcopy(model.state_dict())
    with pytest.warns(UserWarning, match=rf"fused_adaln was requested but matched nothing in "
                                         rf"{name}: {NOTHING_FUSED[name]}: RMSNorm"):
        report = parallelize(model, fused_adaln=True)
    assert report.conversion.counts()["fused_adaln"] == 0 and not fused_classes(model)
    assert "matched nothing (warned)" in str(report) and "RMSNorm" in str(report)
    assert model.state_dict().keys() == before.keys()


def test_a_subclass_of_a_family_block_is_not_matched():
    """A user's subclass may change the forward: only diffusers' exact classes are converted."""
    from diffusers.models.transformers.transformer_flux import FluxTransformerBlock

    class MyBlock(FluxTransformerBlock):
        pass

    holder = torch.nn.Sequential(MyBlock(16, 2, 8))
    ModuleConverter(fused_adaln=True).convert(holder)
    assert type(holder[0]) is MyBlock
    assert type(holder[0].norm1).__name__ == "FusedAdaLNAdaLayerNormZero"  # its diffusers norms still are
