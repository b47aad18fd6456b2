"""Shared by the kernel tests: the device they run on and per-dtype tolerances.

Kernel outputs are compared with references computed in float64 from the same (already rounded)
inputs, so the expected error is the kernel's one final rounding to the output dtype plus fp32
arithmetic:

* fp32: atol = rtol = 1e-5;
* fp16: atol = rtol = 2e-3, about twice fp16's unit roundoff (2**-10 ~ 9.8e-4);
* bf16: atol = rtol = 1e-2, about 2.5 times bf16's unit roundoff (2**-8 ~ 3.9e-3).
"""

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """``actual`` (in its own dtype) against a float64 ``expected``, with ``actual.dtype``'s tolerance;
    a failure names ``what`` and the worst mismatch."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(
        actual.double(), expected.double(), **TOLERANCES[actual.dtype],
        msg=lambda m: f"{what} ({actual.dtype}): {m}",
    )


def force_column_chunks(monkeypatch) -> None:
    """Send every width to the column-chunked kernels (rows too wide for registers take them anyway)."""
    triton_kernels = pytest.importorskip("opendit_lite.kernels.norm_affine_triton")
    monkeypatch.setattr(triton_kernels, "ROW_MAX_FWD", 0)
    monkeypatch.setattr(triton_kernels, "ROW_MAX_BWD", 0)
