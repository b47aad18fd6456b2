"""HunyuanVideo 1.5's fused AdaLN (``families/hunyuan_video15/fused_norms.py``) against the same model
unconverted: the output and every parameter's gradient (fp32, 1e-5), through the kernels' torch path
(one Triton interpreter run measured the same: a few seconds more of CPU); the state-dict keys stay
diffusers'. Its TeaCache signal (``step_cache.py``) is the tensor its first block's attention receives."""

import copy

import torch

import opendit_lite.kernels.adaln as adaln_kernel
import opendit_lite.kernels.gated_residual as residual_kernel
from opendit_lite.converter import ModuleConverter
from opendit_lite.families import FAMILIES
from tests.parallel import tiny_families as fam

TOL = 1e-5
FUSED = {"HunyuanVideo15TransformerBlock", "AdaLayerNormZero", "AdaLayerNormContinuous"}


def _loss_and_grads(model, inputs):
    model.zero_grad()
    out = model(**inputs)[0]
    loss = out.square().mean()
    loss.backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fused_hunyuan_video15_equals_unconverted(monkeypatch):
    # the kernels' torch path: the block binding is what is HunyuanVideo 1.5's own (the kernels themselves are
    # checked against it through Triton in tests/kernels and tests/converter/test_diffusers_families.py)
    monkeypatch.setattr(adaln_kernel, "triton_runs_on", lambda x: False)
    monkeypatch.setattr(residual_kernel, "triton_runs_on", lambda x: False)
    model = fam.build("hunyuan_video15")
    converted = copy.deepcopy(model)
    ModuleConverter(fused_adaln=True).convert(converted)
    assert {type(m).__name__[len("FusedAdaLN"):] for m in converted.modules()
            if type(m).__name__.startswith("FusedAdaLN")} == FUSED
    assert converted.state_dict().keys() == model.state_dict().keys()
    inputs = fam.inputs("hunyuan_video15", model)
    ref_out, ref_grads = _loss_and_grads(model, inputs)
    out, grads = _loss_and_grads(converted, inputs)
    torch.testing.assert_close(out, ref_out, rtol=TOL, atol=TOL)
    assert grads.keys() == ref_grads.keys()
    for key, grad in grads.items():
        err = (grad - ref_grads[key]).abs().max().item()
        assert err < TOL * max(1.0, ref_grads[key].abs().max().item()), f"{key}: {err}"


def test_teacache_signal_is_what_the_first_block_attention_receives():
    model = fam.build("hunyuan_video15").eval()
    block, seen = model.transformer_blocks[0], {}
    spec = FAMILIES["hunyuan_video15"].step_cache
    assert type(block).__name__ == spec.head_block
    block.register_forward_pre_hook(
        lambda m, args, kwargs: seen.update(signal=spec.teacache_signal(m, args, kwargs)), with_kwargs=True)
    block.attn.register_forward_pre_hook(lambda m, args, kwargs: seen.update(attn=kwargs["hidden_states"]),
                                         with_kwargs=True)
    with torch.no_grad():
        model(**fam.inputs("hunyuan_video15", model))
    assert torch.equal(seen["signal"], seen["attn"])
