"""Test-only patches that let Colossal-AI's LowLevelZero run on the CPU (gloo). Never import from the library.

LowLevelZero asserts a CUDA/NPU accelerator and asks the accelerator for streams, which
Colossal-AI's CpuAccelerator refuses. On the CPU every op is synchronous, so the device check can
be skipped and streams can be no-ops; the arithmetic and the collectives are the real ones.
Call ``install()`` at the start of each test process that boosts with zero_degree 1 or 2, or
``install(monkeypatch)`` to have them undone at the end of one test in a shared process.
"""

from contextlib import nullcontext

from colossalai.accelerator.cpu_accelerator import CpuAccelerator
from colossalai.zero import LowLevelZeroOptimizer

from opendit_lite.plugins import zero as zero_strategy


def _patches():
    return [
        (zero_strategy, "check_zero_device", lambda: None),  # the plugin's up-front "needs CUDA" check
        (LowLevelZeroOptimizer, "_sanity_checks", lambda self: None),
        (CpuAccelerator, "Stream", lambda self, *args, **kwargs: None),
        (CpuAccelerator, "current_stream", lambda self, *args, **kwargs: None),
        (CpuAccelerator, "stream", lambda self, *args, **kwargs: nullcontext()),
        (CpuAccelerator, "synchronize", lambda self, *args, **kwargs: None),
    ]


def install(monkeypatch=None) -> None:
    for target, name, value in _patches():
        if monkeypatch is None:
            setattr(target, name, value)
        else:
            monkeypatch.setattr(target, name, value)
