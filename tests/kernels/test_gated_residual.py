"""Fused adaLN-Zero residual + next norm: both outputs and every gradient against
``reference_gated_residual`` (float64), awkward shapes under Triton's interpreter on CPU."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import opendit_lite.kernels.gated_residual as residual_module
from opendit_lite.kernels import FusedGatedResidualNorm, gated_residual_adaln
from opendit_lite.models.layers import GatedResidualNorm
from tests.kernels.helpers import DEVICE, assert_close, force_column_chunks

EPS = 1e-6


def reference_gated_residual(x, h, gate, shift, scale, eps=EPS):
    """``x_new = x + gate * h`` and ``LayerNorm(x_new) * (1 + scale) + shift``; gate, shift, scale
    [B, D] (per sample) or [B, N, D] (per token)."""
    if gate.dim() == 2:
        gate, shift, scale = gate.unsqueeze(1), shift.unsqueeze(1), scale.unsqueeze(1)   # [B, 1, D]
    x_new = x + gate * h
    return x_new, F.layer_norm(x_new, x.shape[-1:], eps=eps) * (1 + scale) + shift


def make_inputs(B, N, D, layout, dtype, mod_dtype=None, x_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mod_dtype, x_dtype = mod_dtype or dtype, x_dtype or dtype
    mod_shape = (B, D) if layout == "sample" else (B, N, D)
    x = torch.randn(B, N, D, generator=gen) * 2 + 0.5
    h = torch.randn(B, N, D, generator=gen)
    gate, shift, scale = (torch.randn(mod_shape, generator=gen) * 0.5 for _ in range(3))
    d_new, dy = torch.randn(B, N, D, generator=gen), torch.randn(B, N, D, generator=gen)
    return ((x.to(DEVICE, x_dtype), h.to(DEVICE, dtype), gate.to(DEVICE, mod_dtype), shift.to(DEVICE, mod_dtype),
             scale.to(DEVICE, mod_dtype)), (d_new.to(DEVICE), dy.to(DEVICE)))


def run(fn, inputs, upstream, use=(True, True)):
    """Outputs and the gradients of every input when the outputs used (x_new, y) get ``upstream``."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*leaves)
    loss = sum((o * u.to(o.dtype)).sum() for o, u, on in zip(outs, upstream, use) if on)
    loss.backward()
    return [o.detach() for o in outs], [t.grad for t in leaves]


def check(inputs, upstream, fn=None, use=(True, True)):
    fn = fn or (lambda *a: gated_residual_adaln(*a, eps=EPS))
    outs, grads = run(fn, inputs, upstream, use)
    ref_outs, ref_grads = run(reference_gated_residual, [t.double() for t in inputs],
                              [u.to(o.dtype).double() for u, o in zip(upstream, outs)], use)
    for what, a, e in zip(("x_new", "y"), outs, ref_outs):
        assert_close(a, e, f"{what} for x {tuple(inputs[0].shape)}, gate {tuple(inputs[2].shape)}")
    for what, g, e, t in zip(("dx", "dh", "dgate", "dshift", "dscale"), grads, ref_grads, inputs):
        e = torch.zeros_like(t, dtype=torch.float64) if e is None else e   # not reached from the used outputs
        assert g.dtype == t.dtype, f"{what} has dtype {g.dtype}, expected the input's {t.dtype}"
        assert_close(g, e, f"{what} for x {tuple(inputs[0].shape)}, gate {tuple(inputs[2].shape)}")


@pytest.mark.parametrize("layout", ["sample", "token"])
@pytest.mark.parametrize("B,N,D", list(itertools.product([1, 3], [1, 7], [24, 72])) + [(2, 5, 1152)])
def test_fp32_shapes(B, N, D, layout):
    check(*make_inputs(B, N, D, layout, torch.float32))


@pytest.mark.parametrize("layout", ["sample", "token"])
@pytest.mark.parametrize("D", [40, 1152])
def test_column_chunked_kernels(monkeypatch, D, layout):
    """The kernels for rows too wide for registers, at widths that would take the one-pass ones."""
    force_column_chunks(monkeypatch)
    check(*make_inputs(2, 5, D, layout, torch.float32))
    check(*make_inputs(2, 5, D, layout, torch.float32), use=(True, False))


@pytest.mark.parametrize("layout", ["sample", "token"])
def test_bf16(layout):
    check(*make_inputs(3, 7, 40, layout, torch.bfloat16))


def test_fp32_residual_with_bf16_branch():
    # DiT under autocast: an fp32 residual stream, bf16 attention output and adaLN chunks.
    check(*make_inputs(2, 9, 40, "sample", torch.bfloat16, x_dtype=torch.float32))


@pytest.mark.parametrize("use", [(True, False), (False, True)])
def test_one_output_unused(use):
    check(*make_inputs(2, 7, 40, "sample", torch.float32), use=use)


def test_strided_chunks_of_one_projection():
    def from_chunks(x, h, gate, shift, scale):
        gate, shift, scale = torch.cat([gate, shift, scale], dim=-1).chunk(3, dim=-1)
        assert not gate.is_contiguous() and gate.stride(-1) == 1
        return gated_residual_adaln(x, h, gate, shift, scale, EPS)

    check(*make_inputs(3, 7, 40, "sample", torch.float32), fn=from_chunks)


def test_backward_is_deterministic():
    inputs, upstream = make_inputs(1, 33, 96, "sample", torch.float32)
    (_, first), (_, second) = run(gated_residual_adaln, inputs, upstream), run(gated_residual_adaln, inputs, upstream)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["sample", "token"])
def test_torch_fallback_matches_reference(monkeypatch, layout):
    monkeypatch.setattr(residual_module, "triton_runs_on", lambda x: False)
    check(*make_inputs(3, 7, 40, layout, torch.float32))
    check(*make_inputs(2, 3, 40, layout, torch.bfloat16))


def test_module_is_a_drop_in_for_gated_residual_norm():
    ref = GatedResidualNorm(40, eps=EPS)
    fused = FusedGatedResidualNorm.from_module(ref)
    assert fused.state_dict().keys() == ref.state_dict().keys() == set()
    inputs, upstream = make_inputs(3, 7, 40, "sample", torch.float32)
    (outs, grads), (ref_outs, ref_grads) = run(fused, inputs, upstream), run(ref, inputs, upstream)
    for a, e, what in zip(outs + grads, ref_outs + ref_grads, ("x_new", "y", "dx", "dh", "dgate", "dshift", "dscale")):
        assert_close(a, e, what)


def test_mismatched_layouts_raise():
    (x, h, gate, shift, scale), _ = make_inputs(2, 3, 8, "sample", torch.float32)
    with pytest.raises(ValueError, match="same shape"):
        gated_residual_adaln(x, h, gate.unsqueeze(1).expand(2, 3, 8), shift, scale)
    with pytest.raises(ValueError, match="must match"):
        gated_residual_adaln(x, h[:, :2], gate, shift, scale)


def reference_affine_gated_residual(x, h, gate, shift, scale, weight, bias, eps=EPS):
    """As ``reference_gated_residual`` with the LayerNorm's own affine map before the modulation."""
    if gate.dim() == 2:
        gate, shift, scale = gate.unsqueeze(1), shift.unsqueeze(1), scale.unsqueeze(1)   # [B, 1, D]
    x_new = x + gate * h
    return x_new, F.layer_norm(x_new, x.shape[-1:], weight, bias, eps=eps) * (1 + scale) + shift


@pytest.mark.parametrize("path", ["triton", "torch"])
@pytest.mark.parametrize("layout", ["sample", "token"])
def test_affine_layernorm(monkeypatch, layout, path):
    """CogVideoX's norms carry weight and bias: outputs and every gradient, weight and bias included."""
    if path == "torch":
        monkeypatch.setattr(residual_module, "triton_runs_on", lambda x: False)
    gen = torch.Generator().manual_seed(3)
    inputs, upstream = make_inputs(3, 7, 40, layout, torch.float32)
    affine = [(1 + 0.3 * torch.randn(40, generator=gen)).to(DEVICE), (0.3 * torch.randn(40, generator=gen)).to(DEVICE)]
    outs, grads = run(lambda *a: gated_residual_adaln(*a[:5], eps=EPS, weight=a[5], bias=a[6]),
                      list(inputs) + affine, upstream)
    ref_outs, ref_grads = run(reference_affine_gated_residual, [t.double() for t in list(inputs) + affine],
                              [u.double() for u in upstream])
    for what, a, e in zip(("x_new", "y", "dx", "dh", "dgate", "dshift", "dscale", "dweight", "dbias"),
                          outs + grads, ref_outs + ref_grads):
        assert_close(a, e, f"{what} ({layout}, {path})")
