"""Whether the Triton norm kernels can run, shared by the fused AdaLN and LayerNorm modules.

The kernels run on CUDA tensors, and on any tensor under Triton's interpreter (``TRITON_INTERPRET=1``
set before ``opendit_lite.kernels`` is first imported; the interpreter is how the tests run them on
CPU). Everywhere else, including a machine without Triton, the modules take their torch path.
"""

from typing import Optional

import torch

try:
    from . import norm_affine_triton
except ImportError:  # Triton is not installed: every call takes the torch path.
    norm_affine_triton = None


def triton_runs_on(x: torch.Tensor) -> bool:
    """Whether the Triton kernels take an input like ``x`` (an empty one goes to torch)."""
    return norm_affine_triton is not None and x.numel() > 0 and norm_affine_triton.runs_on(x)


def triton_unavailable_reason() -> Optional[str]:
    """Why the Triton kernels cannot run at all, or None when they can (on CUDA tensors at least)."""
    return None if norm_affine_triton is not None else "triton is not installed"
