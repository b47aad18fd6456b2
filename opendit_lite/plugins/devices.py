"""What each ZeRO degree needs of the machine, for the plugin's checks and error messages."""

from typing import List

import torch


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
