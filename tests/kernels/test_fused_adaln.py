"""Fused AdaLN (LayerNorm + modulate): output and every gradient against ``reference_adaln``.

On CPU the Triton kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
without a GPU), so shapes are small but awkward: batch > 1, token counts that do not fill a block of
rows, feature counts that are not powers of two, both modulation layouts. ``reference_adaln`` is
also the eager baseline of benchmarks/bench_fused_adaln.py.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

import opendit_lite.kernels.adaln as adaln_module
from opendit_lite.kernels import FusedLayerNormModulate, fused_adaln, triton_runs_on
from opendit_lite.models.layers import LayerNormModulate
from tests.kernels.helpers import DEVICE, assert_close, force_column_chunks

EPS = 1e-6


def reference_adaln(x, shift, scale, eps=EPS):
    """Affine-free LayerNorm over the last axis, then ``* (1 + scale) + shift``.

    x: [B, N, D]; shift, scale: [B, D] (per sample, broadcast over N) or [B, N, D] (per token).
    """
    if shift.dim() == 2:
        shift, scale = shift.unsqueeze(1), scale.unsqueeze(1)       # [B, 1, D]
    return F.layer_norm(x, x.shape[-1:], eps=eps) * (1 + scale) + shift


def make_inputs(B, N, D, layout, dtype, mod_dtype=None, seed=0):
    """x with a non-zero mean, per-sample or per-token shift/scale, and an upstream gradient."""
    gen = torch.Generator().manual_seed(seed)
    mod_dtype = mod_dtype or dtype
    mod_shape = {"sample": (B, D), "sample3d": (B, 1, D), "token": (B, N, D)}[layout]
    x = torch.randn(B, N, D, generator=gen) * 2 + 0.5
    shift = torch.randn(mod_shape, generator=gen) * 0.5
    scale = torch.randn(mod_shape, generator=gen) * 0.5
    dy = torch.randn(B, N, D, generator=gen)
    return x.to(DEVICE, dtype), shift.to(DEVICE, mod_dtype), scale.to(DEVICE, mod_dtype), dy.to(DEVICE)


def run(fn, x, shift, scale, dy):
    """Output and (dx, dshift, dscale) of ``fn`` for leaf copies of the inputs."""
    x, shift, scale = (t.detach().clone().requires_grad_() for t in (x, shift, scale))
    y = fn(x, shift, scale)
    y.backward(dy.to(y.dtype))
    return y.detach(), x.grad, shift.grad, scale.grad


def check_against_reference(x, shift, scale, dy, fn=None):
    fn = fn or (lambda a, b, c: fused_adaln(a, b, c, EPS))
    got = run(fn, x, shift, scale, dy)
    # The reference runs in float64 on the same rounded inputs and upstream gradient.
    expected = run(reference_adaln, x.double(), shift.double(), scale.double(), dy.to(got[0].dtype).double())
    assert got[0].dtype == torch.promote_types(x.dtype, shift.dtype)
    for what, a, e, inp in zip(("y", "dx", "dshift", "dscale"), got, expected, (None, x, shift, scale)):
        if inp is not None:
            assert a.dtype == inp.dtype, f"{what} has dtype {a.dtype}, expected the input's {inp.dtype}"
        assert_close(a, e, f"{what} for x {tuple(x.shape)}, shift {tuple(shift.shape)}")


def test_triton_path_is_taken():
    pytest.importorskip("triton")
    x = torch.zeros(1, 1, 8, device=DEVICE)
    assert triton_runs_on(x), (
        "the fused kernels would take the torch path here: opendit_lite.kernels was imported before "
        "TRITON_INTERPRET=1 was set (tests/conftest.py sets it), so the kernels were "
        "decorated for compilation, which needs CUDA tensors. Set TRITON_INTERPRET=1 in the "
        "environment or in tests/conftest.py."
    )


@pytest.mark.parametrize("layout", ["sample", "token"])
@pytest.mark.parametrize("B,N,D", list(itertools.product([1, 3], [1, 7, 33], [24, 40, 96])))
def test_fp32_shapes(B, N, D, layout):
    check_against_reference(*make_inputs(B, N, D, layout, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["sample", "token"])
def test_dit_xl_width(layout, dtype):
    # DiT-XL's D = 1152: nine column chunks of 128, several rows per program.
    check_against_reference(*make_inputs(2, 3, 1152, layout, dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["sample", "token"])
@pytest.mark.parametrize("B,N,D", [(3, 7, 40), (1, 33, 96), (2, 5, 24)])
def test_low_precision(B, N, D, layout, dtype):
    check_against_reference(*make_inputs(B, N, D, layout, dtype))


@pytest.mark.parametrize("x_dtype,mod_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_mixed_dtypes(x_dtype, mod_dtype):
    # e.g. a bf16 activation modulated by an fp32 adaLN projection: fp32 output, each grad in its input's dtype
    check_against_reference(*make_inputs(3, 7, 40, "sample", x_dtype, mod_dtype))


def test_sample_layout_with_singleton_token_axis():
    check_against_reference(*make_inputs(3, 33, 40, "sample3d", torch.float32))


@pytest.mark.parametrize("layout", ["sample", "token"])
def test_strided_modulation_from_chunked_projection(layout):
    # DiT takes shift and scale as chunks of one adaLN projection: views with a row stride of 2D.
    def from_chunks(x, shift, scale):
        shift, scale = torch.cat([shift, scale], dim=-1).chunk(2, dim=-1)
        assert not shift.is_contiguous() and shift.stride(-1) == 1
        return fused_adaln(x, shift, scale, EPS)

    check_against_reference(*make_inputs(3, 7, 40, layout, torch.float32), fn=from_chunks)


def test_non_contiguous_x():
    x, shift, scale, dy = make_inputs(3, 7, 40, "sample", torch.float32)
    x_t = x.transpose(0, 1).contiguous().transpose(0, 1)    # same values, [B, N, D] view with odd strides
    assert not x_t.is_contiguous()
    check_against_reference(x_t, shift, scale, dy)


def test_backward_is_deterministic():
    inputs = make_inputs(1, 33, 96, "sample", torch.float32)
    first, second = run(fused_adaln, *inputs), run(fused_adaln, *inputs)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["sample", "token"])
def test_torch_fallback_matches_reference(monkeypatch, layout, dtype):
    # The path CPU tensors take outside the interpreter (and every tensor without Triton).
    monkeypatch.setattr(adaln_module, "triton_runs_on", lambda x: False)
    check_against_reference(*make_inputs(3, 7, 40, layout, dtype))
    check_against_reference(*make_inputs(2, 3, 1152, layout, dtype))


def test_empty_batch_takes_torch_path():
    x, shift, scale, _ = make_inputs(0, 7, 40, "sample", torch.float32)
    assert fused_adaln(x, shift, scale).shape == (0, 7, 40)


def test_module_is_a_drop_in_for_layer_norm_modulate():
    torch.manual_seed(0)
    ref = LayerNormModulate(40, eps=1e-6)
    fused = FusedLayerNormModulate.from_module(ref)
    assert (fused.hidden_size, fused.eps) == (ref.hidden_size, ref.eps)  # same attributes, no model import
    assert fused.state_dict().keys() == ref.state_dict().keys() == set()
    x, shift, scale, dy = make_inputs(3, 7, 40, "sample", torch.float32)
    got, expected = run(fused, x, shift, scale, dy), run(ref, x, shift, scale, dy)
    for a, e, what in zip(got, expected, ("y", "dx", "dshift", "dscale")):
        assert_close(a, e, what)


@pytest.mark.parametrize("x_shape,shift_shape,scale_shape,match", [
    ((3, 40), (3, 40), (3, 40), "x of shape"),
    ((3, 7, 40), (3, 40), (3, 7, 40), "same shape"),
    ((3, 7, 40), (1, 40), (1, 40), "per sample"),
    ((3, 7, 40), (3, 5, 40), (3, 5, 40), "per token"),
    ((3, 7, 40), (3, 39), (3, 39), "per sample"),
])
def test_bad_shapes_raise(x_shape, shift_shape, scale_shape, match):
    with pytest.raises(ValueError, match=match):
        fused_adaln(torch.zeros(x_shape), torch.zeros(shift_shape), torch.zeros(scale_shape))


def test_integer_input_raises():
    with pytest.raises(TypeError, match="floating-point"):
        fused_adaln(torch.zeros(1, 2, 8, dtype=torch.int32), torch.zeros(1, 8), torch.zeros(1, 8))


@pytest.mark.parametrize("layout", ["sample", "token"])
@pytest.mark.parametrize("D", [72, 216, 4099])
def test_widths_walked_in_column_chunks(monkeypatch, D, layout):
    # 72 * k (head_dim-72 models) and a prime wider than the widest chunk: several chunks per row.
    force_column_chunks(monkeypatch)
    check_against_reference(*make_inputs(3, 5, D, layout, torch.float32))


def test_kernel_choice_by_width():
    triton_kernels = pytest.importorskip("opendit_lite.kernels.norm_affine_triton")
    assert triton_kernels.uses_row_kernels(1152, backward=False) and triton_kernels.uses_row_kernels(1152, True)
    assert triton_kernels.uses_row_kernels(4099, backward=False) and not triton_kernels.uses_row_kernels(4099, True)
    assert triton_kernels.row_settings(32768, 1152, backward=False)[:2] == (2, 2048)   # 2 rows of 2048 lanes
    assert triton_kernels.row_settings(32768, 1152, backward=True)[:2] == (1, 2048)
    assert triton_kernels.row_settings(3, 24, backward=False)[0] == 4                 # no more rows than there are


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dit_xl_width_in_column_chunks(monkeypatch, dtype):
    force_column_chunks(monkeypatch)
    check_against_reference(*make_inputs(2, 3, 1152, "sample", dtype))


def test_column_block_leaves_no_idle_lanes_at_dit_widths():
    triton_kernels = pytest.importorskip("opendit_lite.kernels.norm_affine_triton")
    assert triton_kernels.column_block(1152) == 128          # 9 full chunks, where one block would pad to 2048
    assert triton_kernels.column_block(1024) == 1024         # a power of two: one chunk
    for D in (384, 768, 1152, 1536, 72 * 16):
        block = triton_kernels.column_block(D)
        lanes = -(-D // block) * block
        assert (lanes - D) / lanes <= triton_kernels.MAX_IDLE_FRACTION, (D, block)


def reference_affine_adaln(x, shift, scale, weight, bias, eps=EPS):
    """LayerNorm with its own affine ``weight``, ``bias`` [D], then ``* (1 + scale) + shift``."""
    if shift.dim() == 2:
        shift, scale = shift.unsqueeze(1), scale.unsqueeze(1)       # [B, 1, D]
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps=eps) * (1 + scale) + shift


@pytest.mark.parametrize("path", ["triton", "torch"])
@pytest.mark.parametrize("layout", ["sample", "token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_affine_layernorm(monkeypatch, layout, path, dtype):
    """The LayerNorm's own weight and bias (CogVideoX) folded into the modulation: output and the
    gradients of x, shift, scale, weight and bias against float64."""
    if path == "torch":
        monkeypatch.setattr(adaln_module, "triton_runs_on", lambda x: False)
    x, shift, scale, dy = make_inputs(3, 7, 40, layout, dtype)
    gen = torch.Generator().manual_seed(5)
    weight = (1 + 0.3 * torch.randn(40, generator=gen)).to(DEVICE, dtype).requires_grad_()
    bias = (0.3 * torch.randn(40, generator=gen)).to(DEVICE, dtype).requires_grad_()
    leaves = [t.detach().clone().requires_grad_() for t in (x, shift, scale)]
    y = fused_adaln(*leaves, EPS, weight=weight, bias=bias)
    y.backward(dy.to(y.dtype))
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, shift, scale, weight, bias)]
    expected = reference_affine_adaln(*ref_leaves)
    expected.backward(dy.to(y.dtype).double())
    assert y.dtype == dtype
    for what, got, ref in zip(("y", "dx", "dshift", "dscale", "dweight", "dbias"),
                              [y.detach()] + [t.grad for t in leaves] + [weight.grad, bias.grad],
                              [expected.detach()] + [t.grad for t in ref_leaves]):
        assert_close(got, ref, f"{what} ({layout}, {path}, {dtype})")


def test_affine_weight_of_the_wrong_width_raises():
    x, shift, scale, _ = make_inputs(2, 3, 8, "sample", torch.float32)
    with pytest.raises(ValueError, match=r"weight has shape \(7,\).*\[D\] = \[8\]"):
        fused_adaln(x, shift, scale, weight=torch.ones(7, device=DEVICE))
