"""This process's place in the default process group, and the two collectives every rank-0-decides
step needs. All of them also work without an initialised group (a world of one)."""

import re
from typing import Any, Optional

import torch
import torch.distributed as dist

# How a collective ends when a peer process has exited (gloo's words; NCCL aborts through DistError).
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe")


def global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def global_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` (any picklable object) on every rank."""
    if global_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another rank went away."""
    return isinstance(error, dist.DistError) or bool(_PEER_GONE.search(str(error)))


def collective_device(group: Optional[dist.ProcessGroup] = None) -> torch.device:
    """Where ``group``'s collectives take their tensors: the current CUDA device when its only backend
    is NCCL (which has none for CPU tensors), else the CPU (gloo, or a "cpu:gloo,cuda:nccl" pair)."""
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
