"""benchmarks/bench_attention.py on the CPU: every provider that runs here gives SDPA's result
(the padded ones included), and a smoke run prints a table per head_dim and picks a fastest."""

import importlib
import os
import sys

import pytest
import torch

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")


@pytest.fixture(scope="module")
def bench():
    if BENCH_DIR not in sys.path:
        sys.path.insert(0, BENCH_DIR)
    return importlib.import_module("bench_attention")


def reference_attention(q, k, v):
    """softmax(q k^T / sqrt(Dh)) v per head, in float64; [B, N, H, Dh] in and out."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return (weights @ v).transpose(1, 2)


def test_providers_equal_attention(bench):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 2, 72, generator=gen) for _ in range(3))
    expected = reference_attention(q, k, v)
    ran = []
    for name, fn in bench.providers(72).items():
        inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))
        if bench.unavailable_reason(fn, inputs) is not None:
            continue  # e.g. cuDNN on the CPU
        torch.testing.assert_close(fn(*inputs).double(), expected, atol=1e-5, rtol=1e-5, msg=name)
        ran.append(name)
    assert {"sdpa", "sdpa-math", "pad80", "pad96", "pad128"} <= set(ran), ran


def test_cpu_smoke_run_prints_a_table_per_head_dim(bench, capsys):
    picks = bench.main(["--device", "cpu", "--head-dims", "72", "64"])
    out = capsys.readouterr().out
    assert set(picks) == {72, 64}
    for head_dim in (72, 64):
        assert f"== head_dim {head_dim}:" in out and f"fastest for head_dim {head_dim}: {picks[head_dim]}" in out
    assert "sdpa-cudnn" in out  # listed, as unavailable on the CPU
