"""Attention backends: the flash-attn op against a softmax(QK^T/sqrt(d))V reference, its SDPA
fallback, and the choice of backend from ``attention_backend``."""

import math

import pytest
import torch

import opendit_lite.kernels.flash_attention as flash_module
from opendit_lite.kernels import FlashAttentionOp, resolve_attention_backend
from opendit_lite.models.layers import SDPAAttentionOp
from tests.kernels.helpers import DEVICE, assert_close


def reference_attention(q, k, v, attn_mask=None):
    """q: [B, Nq, H, Dh]; k, v: [B, Nk, H, Dh]; boolean mask [B, 1|H, Nq, Nk] (True = attend)."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.size(-1))  # [B, H, Nq, Nk]
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)       # [B, Nq, H, Dh]


def qkv(B=2, N=9, H=3, Dh=8, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, N, H, Dh, generator=gen).to(DEVICE, dtype).requires_grad_() for _ in range(3)]


def grads(fn, inputs, mask=None):
    out = fn(*inputs, attn_mask=mask)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    dq, dk, dv = torch.autograd.grad(out, inputs, dout)
    return out.detach(), dq, dk, dv


@pytest.mark.parametrize("with_mask", [False, True])
def test_fp32_falls_back_to_sdpa(with_mask):
    # fp32 (or CPU, or a mask): FlashAttentionOp must give what SDPA gives, gradients included.
    inputs = qkv()
    mask = (torch.rand(2, 1, 9, 9, device=DEVICE) > 0.3) | torch.eye(9, dtype=torch.bool, device=DEVICE) \
        if with_mask else None
    op = FlashAttentionOp()
    assert not op.flash_applies(inputs[0], mask)
    got = grads(op, inputs, mask)
    expected = grads(reference_attention, [t.detach().double().requires_grad_() for t in inputs], mask)
    for what, a, e in zip(("out", "dq", "dk", "dv"), got, expected):
        assert_close(a, e, f"attention {what}")


def test_flash_op_is_an_sdpa_op_with_its_own_backend_name():
    op = FlashAttentionOp()
    assert isinstance(op, SDPAAttentionOp) and op.backend == "flash"
    assert "backend=flash" in repr(op)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_attn_matches_reference(dtype):
    pytest.importorskip("flash_attn", reason="flash-attn is not installed (optional: pip install flash-attn)")
    inputs = qkv(B=2, N=257, H=4, Dh=72, dtype=dtype)  # DiT-XL's head size; N not a multiple of a tile
    op = FlashAttentionOp()
    assert op.flash_applies(inputs[0], None)
    got = grads(op, inputs)
    expected = grads(reference_attention, [t.detach().double().requires_grad_() for t in inputs])
    for what, a, e in zip(("out", "dq", "dk", "dv"), got, expected):
        # flash-attn rounds P to the input dtype before P @ V: a few units of that dtype's roundoff.
        torch.testing.assert_close(a.double(), e, atol=3e-2, rtol=3e-2, msg=lambda m: f"flash {what}: {m}")


def test_backend_choice(monkeypatch):
    assert resolve_attention_backend("sdpa")[0] == "sdpa"
    monkeypatch.setattr(flash_module, "flash_attn_version", lambda: None)
    assert resolve_attention_backend("auto") == ("sdpa", "flash-attn not installed")
    backend, reason = resolve_attention_backend("flash")
    assert backend == "sdpa" and "not installed" in reason
    monkeypatch.setattr(flash_module, "flash_attn_version", lambda: "2.7.4")
    for requested in ("flash", "auto"):
        backend, reason = resolve_attention_backend(requested)
        assert backend == "flash" and "flash-attn 2.7.4" in reason


def test_unknown_backend_raises():
    with pytest.raises(ValueError, match="not one of sdpa, flash, auto"):
        resolve_attention_backend("xformers")
