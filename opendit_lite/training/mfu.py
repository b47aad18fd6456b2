"""Model FLOPs utilisation of a training run: FLOPs per optimizer step counted once, and the
dense bf16 peaks MFU is measured against.

The FLOPs of one micro-batch (forward and backward) are counted by running it under
``torch.utils.flop_counter.FlopCounterMode``, which adds up the matrix products (linear layers,
convolutions, attention) the dispatcher sees, so any model is covered without a formula per family.
Kernels the counter does not know (our Triton kernels, flash-attn) count as zero, and recomputation
under activation checkpointing counts (benchmarks/flops.py has the formula-based model FLOPs that
leave it out). The count is per rank: under sequence parallelism each rank counts its share.
"""

from typing import Callable, Optional, Sequence, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode

# Dense (no 2:4 sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' data sheets, for
# MFU. Matched as substrings of torch.cuda.get_device_name(), first match wins, so the PCIe H100
# (756) comes before the SXM one.
DENSE_BF16_PEAK_TFLOPS: Sequence[Tuple[str, float]] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
)


def device_peak_tflops(device_name: str) -> Optional[float]:
    """The dense bf16 peak of a known GPU by name, or None (pass ``--peak-tflops`` then)."""
    return next((peak for key, peak in DENSE_BF16_PEAK_TFLOPS if key in device_name), None)


def current_device_peak_tflops(device: torch.device) -> Optional[float]:
    """The peak of ``device`` when it is a known GPU, else None (MFU is then not reported)."""
    if device.type != "cuda":
        return None
    return device_peak_tflops(torch.cuda.get_device_name(device))


def counted_flops(fn: Callable[[], object]) -> Tuple[object, float]:
    """Run ``fn()`` (e.g. one micro-batch's loss and backward) and return (its result, the FLOPs
    of the matrix products it ran on this rank)."""
    counter = FlopCounterMode(display=False)
    with counter:
        result = fn()
    return result, float(counter.get_total_flops())
