"""zero_degree 3: Colossal-AI's Gemini, chunk-based ZeRO-3 with CPU offload.

Gemini packs parameters into fixed-size chunks; every chunk (working bf16/fp16 weights, fp32 master
weights, optimizer state) is sharded over ``zero_group`` and gathered one chunk at a time during
forward and backward. With a ``replica_group`` (grouped ZeRO) each chunk shard is held once per
node and its gradient is all-reduced across nodes, which is what Gemini's ``extra_dp_group`` does.
Colossal-AI's ``GeminiPlugin`` lays its mesh out so that the ZeRO axis is strided over the ranks
(it spans nodes), so the chunks are built here with our own groups instead.

Gemini needs CUDA and one of Colossal-AI's Adam kernels (``HybridAdam`` updates CPU-resident and
GPU-resident shards alike); its precision is bf16 or fp16 working weights with fp32 masters.
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn
from colossalai.accelerator import get_accelerator
from colossalai.booster.plugin.gemini_plugin import get_param_info
from colossalai.zero import GeminiDDP, GeminiOptimizer
from torch.distributed import ProcessGroup
from torch.optim import Optimizer

from .sync import broadcast_module_states


def apply_gemini(
    model: nn.Module,
    optimizer: Optional[Optimizer],
    *,
    dtype: torch.dtype,
    zero_group: ProcessGroup,
    replica_group: Optional[ProcessGroup],
    placement_policy: str,
    offload_optim_frac: float,
    offload_param_frac: float,
    max_norm: float,
    **gemini_kwargs,
) -> Tuple[GeminiDDP, Optional[GeminiOptimizer]]:
    """Give ``model`` rank 0's weights, wrap it in ``GeminiDDP`` and ``optimizer`` (a Colossal-AI
    Adam) in ``GeminiOptimizer``.

    ``placement_policy``: "static" (fixed fractions below) or "auto" (moves chunks by measured
    memory); ``offload_optim_frac`` / ``offload_param_frac``: fraction of optimizer-state /
    parameter chunks kept on the CPU under "static"; ``max_norm``: clipping, 0 disables;
    ``gemini_kwargs`` go to ``GeminiDDP`` (``enable_gradient_accumulation``, ``hidden_dim``,
    ``search_range_m``, ``min_chunk_size_m``, ``pin_memory``, ...).
    """
    params_info = get_param_info(optimizer)  # parameter shapes, read before Gemini replaces them
    device = get_accelerator().get_current_device()
    broadcast_module_states(model, device)  # rank 0's weights, before each rank keeps its shard
    gemini_kwargs.setdefault("pin_memory", True)  # asynchronous host<->device copies of offloaded chunks
    model = GeminiDDP(
        model,
        chunk_init_device=device,
        placement_policy=placement_policy,
        offload_optim_frac=offload_optim_frac,
        offload_param_frac=offload_param_frac,
        mixed_precision=dtype,
        zero_group=zero_group,
        extra_dp_group=replica_group,
        **gemini_kwargs,
    )
    if optimizer is not None:
        optimizer = GeminiOptimizer(optimizer, model, max_norm=max_norm, params_info=params_info)
    return model, optimizer
