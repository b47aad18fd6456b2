"""Start every rank from the same weights: global rank 0's parameters and buffers.

DDP broadcasts them when it wraps a model; Colossal-AI's LowLevelZero and Gemini do not, they
shard whatever each rank holds. If the model was initialised with a per-rank seed, the shards
would come from different models and the first step would average gradients of different
networks. Broadcasting before sharding gives every strategy DDP's starting point.
"""

import itertools

import torch
import torch.distributed as dist
import torch.nn as nn


@torch.no_grad()
def broadcast_module_states(module: nn.Module, device: torch.device) -> None:
    """Overwrite ``module``'s parameters and buffers with global rank 0's, in place.

    Each tensor travels through ``device`` (the collective's device, e.g. the GPU for NCCL), one
    tensor at a time, so a model still on the CPU needs only one tensor's worth of device memory.
    """
    if dist.get_world_size() == 1:
        return
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        staged = tensor.data.to(device)
        # float8 tensors (a frozen FP8 base) travel as their bytes: not every backend knows the dtype.
        wire = staged.view(torch.uint8) if staged.is_floating_point() and staged.element_size() == 1 else staged
        dist.broadcast(wire, src=0)
        if staged is not tensor.data:
            tensor.data.copy_(staged)
