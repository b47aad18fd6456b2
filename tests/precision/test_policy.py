"""The precision resolved once: every name on CUDA and on the CPU against a table written here,
``auto``'s choice per device, the one warning for bf16 on the CPU, and a clear error for a name
that does not exist."""

import pytest
import torch

from opendit_lite.precision import PRECISION_NAMES, policy, resolve_precision

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
# name -> (param_dtype, autocast_dtype, fp8, tf32 on CUDA, dtype_name, bytes per activation element)
EXPECTED = {
    "fp32": (FP32, None, False, False, "fp32", 4),
    "tf32": (FP32, None, False, True, "fp32", 4),
    "bf16": (BF16, BF16, False, False, "bf16", 2),
    "fp16": (FP16, FP16, False, False, "fp16", 2),
    "fp8": (BF16, BF16, True, False, "bf16", 2),
}


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_name_resolves_to_its_dtypes(name, device):
    p = resolve_precision(name, device)
    param, autocast, fp8, tf32, dtype_name, element = EXPECTED[name]
    assert (p.name, p.param_dtype, p.autocast_dtype, p.fp8) == (name, param, autocast, fp8)
    assert p.tf32 == (tf32 and device == "cuda")  # TF32 is a CUDA matmul mode
    assert (p.dtype_name, p.element_bytes) == (dtype_name, element)


def test_auto_is_bf16_on_cuda_and_fp32_on_the_cpu():
    assert resolve_precision("auto", "cuda") == resolve_precision("bf16", "cuda")
    assert resolve_precision("auto", "cpu") == resolve_precision("fp32", "cpu")
    assert set(PRECISION_NAMES) == {"auto", *EXPECTED}


def test_allow_tf32_turns_tf32_matmuls_on_for_any_name_on_cuda_only():
    assert resolve_precision("fp32", "cuda", allow_tf32=True).tf32
    assert resolve_precision("bf16", "cuda", allow_tf32=True).tf32
    assert not resolve_precision("fp32", "cpu", allow_tf32=True).tf32


def test_explicit_bf16_on_the_cpu_warns_once(capsys, monkeypatch):
    monkeypatch.setattr(policy, "_warned", set())
    for _ in range(3):
        resolve_precision("bf16", "cpu")
    resolve_precision("fp32", "cpu")
    resolve_precision("bf16", "cuda")
    err = capsys.readouterr().err
    assert err.count("warning: precision=bf16 on the CPU is several times slower than fp32") == 1
    assert err.count("warning") == 1


def test_unknown_name_says_which_exist():
    with pytest.raises(ValueError, match="precision='int8' is not supported; use one of auto, fp32, tf32, bf16"):
        resolve_precision("int8", "cpu")
