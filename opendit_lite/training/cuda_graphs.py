"""``cuda_graphs: true``: replay the compiled blocks as CUDA graphs (torch.compile's "reduce-overhead",
applied by ``parallelize``'s compile step); here, the check that a run can use it.

A DiT-XL/2 step at 256 px launches thousands of small kernels (norms, elementwise ops, the
optimizer); with CUDA graphs each compiled block's forward and backward is recorded once and then
replayed with one launch, which removes the CPU launch overhead between kernels. It needs what a
graph needs: CUDA, and the same shapes every step (image training with a fixed resolution and a
``drop_last`` loader, as train.py builds it; not variable-shape buckets). It applies to what is
compiled, so it needs ``compile: true``.
"""

import torch

from ..config import ConfigError


def check_cuda_graphs(*, cuda_graphs: bool, compile: bool, device: torch.device) -> None:
    """Raise ``ConfigError`` when ``cuda_graphs`` is asked for where it cannot apply."""
    if not cuda_graphs:
        return
    if device.type != "cuda":
        raise ConfigError(f"cuda_graphs=true records CUDA graphs and needs a CUDA GPU; this run is on {device.type}. "
                          f"Set cuda_graphs=false.")
    if not compile:
        raise ConfigError("cuda_graphs=true replays the torch.compile'd blocks as CUDA graphs; set compile=true "
                          "as well, or cuda_graphs=false.")
