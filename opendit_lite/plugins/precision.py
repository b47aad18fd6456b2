"""Training precision names, the ``"auto"`` default and what each ZeRO degree needs of the machine.

``"auto"`` is bf16 on a CUDA GPU and fp32 on the CPU: CPUs have no fast bf16 matmul, so a bf16 run
there is several times slower than fp32 (about 9x for the earlier demo model, DiT-Mini/4, on two cores).
An explicit bf16/fp16 on the CPU is respected with a one-line warning on stderr.
"""

import sys
from typing import Dict, List, Optional

import torch

PRECISIONS: Dict[str, Optional[torch.dtype]] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
AUTO = "auto"


def resolve_precision(precision: str, device_type: Optional[str] = None) -> str:
    """``precision`` with ``"auto"`` replaced by the default of ``device_type`` (default: "cuda" when a GPU
    is visible, else "cpu"). Warns once on stderr when bf16/fp16 is asked for on the CPU."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if precision == AUTO:
        return "bf16" if device_type == "cuda" else "fp32"
    if precision in ("bf16", "fp16") and device_type == "cpu":
        print(f"warning: precision={precision} on the CPU is several times slower than fp32 (no fast {precision} "
              f"matmul there); precision=auto picks fp32 on the CPU", file=sys.stderr)
    return precision


def usable_zero_degrees() -> List[int]:
    """The ``zero_degree`` values this machine can run: DDP everywhere, LowLevelZero (1, 2) on an
    accelerator, Gemini (3) on CUDA; error messages suggest only these."""
    from colossalai.accelerator import get_accelerator

    degrees = [0]
    if get_accelerator().name != "cpu":
        degrees += [1, 2]
    if torch.cuda.is_available():
        degrees.append(3)
    return degrees


def zero_degree_hint() -> str:
    """"use zero_degree=0 (DDP) on this machine" or the list of the degrees that work here."""
    degrees = usable_zero_degrees()
    if degrees == [0]:
        return "use zero_degree=0 (DDP) on this machine"
    return f"use zero_degree {', '.join(map(str, degrees[:-1]))} or {degrees[-1]} on this machine"
