"""The dispatch that keeps the fused kernels never slower than torch.compile (kernel_choice.py), on
the CPU with a scripted timer: the faster candidate is kept, measured once per signature, logged once,
saved to and read from the JSON cache; off CUDA nothing is timed; a wrapper serving a signature the
compiled torch path won returns what the reference below computes; inside torch.compile the cached
choice is a constant of the graph (no graph break) and an unmeasured signature takes the kernel."""

import json
import logging

import pytest
import torch
import torch.nn.functional as F

import opendit_lite.kernels.adaln as adaln_module
from opendit_lite.kernels import fused_adaln, kernel_choice


class ScriptedTimer:
    """Returns the scripted milliseconds in turn (triton first, then compile, per measurement); ``run``:
    calls each candidate once too."""

    def __init__(self, *ms, run=False):
        self.ms, self.calls, self.run = list(ms), 0, run

    def __call__(self, fn):
        self.calls += 1
        if self.run:
            fn()
        return self.ms.pop(0)


def reference_adaln(x, shift, scale, eps=1e-6):
    return (F.layer_norm(x.float(), x.shape[-1:], eps=eps) * (1 + scale.float()[:, None]) + shift.float()[:, None]
            ).to(x.dtype)


@pytest.fixture
def measuring(monkeypatch):
    """The dispatch as on CUDA (CPU tensors treated as chosen on), with a fresh cache per test."""
    monkeypatch.setenv(kernel_choice.ENV_MODE, "measure")
    monkeypatch.setattr(kernel_choice, "chooses_on", lambda x: True)
    old = kernel_choice.set_cache(None)
    yield
    kernel_choice.set_cache(old)


def test_choice_cache_keeps_the_faster_once_logs_once_and_saves(tmp_path, caplog):
    path = str(tmp_path / "choices.json")
    timer = ScriptedTimer(0.30, 0.20, 0.10, 0.25, 0.5, 0.5)
    cache = kernel_choice.ChoiceCache(timer=timer, path=path)
    with caplog.at_level(logging.INFO, logger="opendit_lite.kernels"):
        first = cache.choose("a", lambda: None, lambda: None)
        assert cache.choose("a", lambda: None, lambda: None) is first and timer.calls == 2  # measured once
        second = cache.choose("b", lambda: None, lambda: None)
        tie = cache.choose("c", lambda: None, lambda: None)
    assert (first.provider, first.triton_ms, first.compile_ms) == ("compile", 0.30, 0.20)
    assert second.provider == "triton" and tie.provider == "triton"  # a tie keeps the kernel
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["kernel choice a", "kernel choice b",
                                                                     "kernel choice c"]
    assert json.load(open(path))["a"] == dict(provider="compile", triton_ms=0.30, compile_ms=0.20, shapeless=None)
    again = kernel_choice.ChoiceCache(timer=ScriptedTimer(), path=path)  # read from the file: nothing timed
    assert again.choose("a", lambda: None, lambda: None) == kernel_choice.Choice("compile", 0.30, 0.20, "file")


def test_off_cuda_nothing_is_timed(monkeypatch):
    monkeypatch.setenv(kernel_choice.ENV_MODE, "measure")
    old = kernel_choice.set_cache(kernel_choice.ChoiceCache(timer=ScriptedTimer()))  # timing would fail
    try:
        x = torch.randn(1, 2, 8)
        kernel, reference = object(), object()
        assert kernel_choice.choose_kernel("fused_adaln", kernel, reference, (x, x, x, 1e-6, None, None)) is kernel
    finally:
        kernel_choice.set_cache(old)
    monkeypatch.setenv(kernel_choice.ENV_MODE, "sometimes")
    with pytest.raises(ValueError, match="OPENDIT_KERNEL_CHOICE"):
        kernel_choice.dispatch_mode()


def test_a_signature_the_compiled_path_won_is_served_by_it(measuring, monkeypatch):
    timer = ScriptedTimer(0.3, 0.2)  # compile faster
    kernel_choice.set_cache(kernel_choice.ChoiceCache(timer=timer))
    monkeypatch.setattr(kernel_choice, "compiled_reference", lambda fn: fn)  # the timer runs nothing
    ran = []
    monkeypatch.setattr(adaln_module, "adaln_triton", lambda *a: ran.append(a) or a[0])
    gen = torch.Generator().manual_seed(0)
    x, shift, scale = (torch.randn(s, generator=gen) for s in ((2, 5, 24), (2, 24), (2, 24)))
    x.requires_grad_(True)
    for _ in range(2):
        torch.testing.assert_close(fused_adaln(x, shift, scale), reference_adaln(x, shift, scale))
    assert timer.calls == 2 and not ran
    (key, choice), = kernel_choice.cache().choices.items()
    assert key == "fused_adaln train f32[2,5,24]g f32[2,24] f32[2,24] 1e-06 None None on cpu"
    assert choice.provider == "compile" and choice.source == "measured"
    with torch.no_grad():  # another signature (no gradients recorded): the kernel wins it
        kernel_choice.cache().timer = ScriptedTimer(0.1, 0.2)
        fused_adaln(x, shift, scale)
    assert len(ran) == 1


def test_inside_torch_compile_the_measured_choice_is_a_constant(measuring, monkeypatch):
    """A compiled graph (shapes possibly symbolic) takes the torch path for an op and dtypes whose every
    measured shape chose it, the kernel for one measured at no shape; no graph break either way."""
    ran = []
    monkeypatch.setattr(adaln_module, "adaln_triton", lambda *a: ran.append(1) or a[0] * 0)
    monkeypatch.setattr(kernel_choice, "compiled_reference", lambda fn: fn)
    x, shift, scale = torch.randn(1, 3, 8), torch.randn(1, 8), torch.randn(1, 8)
    kernel_choice.cache().timer = ScriptedTimer(0.3, 0.2)
    fused_adaln(x, shift, scale)  # eager: measured, the compiled torch path won
    compiled = torch.compile(lambda a, b, c: fused_adaln(a, b, c), backend="eager", fullgraph=True)
    for n in (3, 4):  # the second shape recompiles with symbolic shapes
        x = torch.randn(1, n, 8)
        torch.testing.assert_close(compiled(x, shift, scale), reference_adaln(x, shift, scale))
    assert not ran
    compiled(x.double(), shift.double(), scale.double())  # other dtypes, not measured: the kernel
    assert ran
    unmeasured = [c for c in kernel_choice.cache().choices.values() if c.source.startswith("not measured")]
    assert [c.provider for c in unmeasured] == ["triton"]


def test_the_compiled_candidate_is_compiled_even_in_an_eager_step(measuring, monkeypatch):
    """``measured_eagerly`` runs the model's compiled code eagerly; the reference it times against must
    still be compiled (a backend that counts its graphs sees it), and its backward run."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(kernel_choice, "compiled_reference", lambda fn: torch.compile(fn, backend=counting))
    kernel_choice.cache().timer = ScriptedTimer(0.2, 0.3, run=True)
    x = torch.randn(1, 3, 8, requires_grad=True)
    with kernel_choice.measured_eagerly():
        y = fused_adaln(x, torch.randn(1, 8), torch.randn(1, 8))
    assert graphs and y.shape == x.shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_both_are_timed_once_and_the_faster_serves(monkeypatch):
    monkeypatch.setenv(kernel_choice.ENV_MODE, "measure")
    old = kernel_choice.set_cache(kernel_choice.ChoiceCache())
    try:
        def t(*size):
            return torch.randn(*size, device="cuda", dtype=torch.bfloat16, requires_grad=True)

        x, shift, scale = t(2, 256, 1152), t(2, 1152), t(2, 1152)
        with kernel_choice.measured_eagerly():
            y = fused_adaln(x, shift, scale)
        (choice,) = kernel_choice.cache().choices.values()
        assert choice.source == "measured" and choice.triton_ms > 0 and choice.compile_ms > 0
        torch.testing.assert_close(y.float(), reference_adaln(x, shift, scale).float(), atol=3e-2, rtol=3e-2)
        y.float().square().sum().backward()
        assert x.grad is not None and shift.grad is not None
        fused_adaln(x, shift, scale)  # measured once
        assert len(kernel_choice.cache().choices) == 1
    finally:
        kernel_choice.set_cache(old)
