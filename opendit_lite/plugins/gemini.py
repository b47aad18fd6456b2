"""zero_degree 3: Colossal-AI's Gemini, chunk-based ZeRO-3 with CPU offload.

Gemini packs parameters into fixed-size chunks; every chunk (working bf16/fp16 weights, fp32 master
weights, optimizer state) is sharded over ``zero_group`` and gathered one chunk at a time during
forward and backward. With a ``replica_group`` (grouped ZeRO) each chunk shard is held once per
node and its gradient is all-reduced across nodes, which is what Gemini's ``extra_dp_group`` does.
Colossal-AI's ``GeminiPlugin`` lays its mesh out so that the ZeRO axis is strided over the ranks
(it spans nodes), so the chunks are built here with our own groups instead.

Gemini needs CUDA and one of Colossal-AI's Adam kernels (``HybridAdam`` updates CPU-resident and
GPU-resident shards alike); its precision is bf16 or fp16 working weights with fp32 masters.

Two things Colossal-AI's Gemini does not do, and this module adds:

* the fp32 masters in checkpoints: Gemini saves the model in its working dtype (the masters rounded
  to bf16) and, loading it, sets the masters to those rounded values, so a resumed run drifts from
  the uninterrupted one. ``master_shards`` / ``load_master_shards`` give and take this rank's fp32
  master slice of every parameter (what ZeRO-1/2's ``master_shards`` give), which the checkpoint
  saves per rank and puts back after the model and optimizer: a same-world-size resume continues
  bit for bit;
* timesteps in fp32: GeminiDDP casts every floating input to the working dtype; the inputs the
  model lists in ``fp32_inputs`` are handed to it as given (``TimestepSafeGeminiDDP``).
"""

import contextlib
from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.nn as nn
from colossalai.accelerator import get_accelerator
from colossalai.booster.plugin.gemini_plugin import get_param_info
from colossalai.utils.common import is_ddp_ignored
from colossalai.zero import GeminiDDP, GeminiOptimizer
from torch.distributed import ProcessGroup
from torch.optim import Optimizer

from .fp32_inputs import kept_arguments, with_arguments
from .sync import broadcast_module_states


class _KeptInputs:
    """The fp32 inputs of the call under way, put back into the module's call by a forward pre-hook."""

    def __init__(self):
        self.values: Dict[str, object] = {}

    @contextlib.contextmanager
    def holding(self, values: Dict[str, object]) -> Iterator[None]:
        self.values = values
        try:
            yield
        finally:
            self.values = {}

    def restore(self, module: nn.Module, args: tuple, kwargs: dict):
        """Forward pre-hook (with kwargs) of the wrapped module: the call's arguments, fp32 ones put back."""
        if not self.values:
            return None
        return with_arguments(module, args, kwargs, self.values)


class TimestepSafeGeminiDDP(GeminiDDP):
    """GeminiDDP, except that the inputs the module declares in ``fp32_inputs`` reach it in the dtype
    they were given (GeminiDDP casts every float input to the working dtype; a forward pre-hook on
    the module puts the originals back, so Gemini's own forward runs unchanged)."""

    def __init__(self, module: nn.Module, *args, **kwargs):
        super().__init__(module, *args, **kwargs)
        self._kept = _KeptInputs()  # the hook holds this, not the wrapper: no reference cycle
        self.module.register_forward_pre_hook(self._kept.restore, with_kwargs=True)

    def forward(self, *args, **kwargs):
        with self._kept.holding(kept_arguments(self.module, args, kwargs)):
            return super().forward(*args, **kwargs)


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
    model = TimestepSafeGeminiDDP(
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


def _master_slices(model: GeminiDDP) -> Iterator[Tuple[str, torch.Tensor]]:
    """(name, this rank's fp32 master slice) of every parameter Gemini trains that has one here.

    A chunk kept gathered holds every parameter whole on every rank; a sharded chunk holds
    ``[shard_begin, shard_end)`` of the chunk, so a parameter gets the part of it in that range.
    The slices are views of the master chunks' payloads, wherever they live (GPU or CPU).
    """
    manager = model.chunk_manager
    for name, p in model.unwrap().named_parameters():
        if is_ddp_ignored(p):
            continue
        chunk = manager.get_chunk(p)
        master = chunk.paired_chunk
        if master is None:
            raise ValueError("Gemini keeps no fp32 master chunks (master_weights=False): nothing to save apart")
        info = chunk.tensors_info[p]
        if chunk.keep_gathered:
            begin, end = info.offset, info.end
        else:
            begin, end = max(0, info.offset - chunk.shard_begin), min(chunk.shard_size, info.end - chunk.shard_begin)
        if begin < end:
            yield name, master.payload[begin:end]


def master_shards(model: GeminiDDP) -> Dict[str, torch.Tensor]:
    """This rank's fp32 master slice of every trained parameter, by name (1-D views)."""
    return dict(_master_slices(model))


@torch.no_grad()
def load_master_shards(model: GeminiDDP, shards: Dict[str, torch.Tensor]) -> None:
    """Copy saved master slices (same world size and chunk layout) into Gemini's fp32 master chunks.

    Call it after loading the model weights of the same checkpoint: those are the masters rounded to
    the working dtype, which is what the working chunks must hold next to these masters. A missing
    name or a slice of another size raises, naming the parameter."""
    slices = dict(_master_slices(model))
    missing = sorted(set(slices) - set(shards))
    if missing:
        raise KeyError(f"no saved fp32 master slice for {len(missing)} parameters (first: {missing[:3]}); the "
                       f"checkpoint was saved with another model or chunk layout")
    for name, master in slices.items():
        saved = shards[name]
        if saved.shape != master.shape:
            raise ValueError(f"fp32 master slice of {name!r} has shape {tuple(saved.shape)}, this run's Gemini "
                             f"chunks give {tuple(master.shape)}: saved with another world size or chunk layout")
        master.copy_(saved.to(master.device))
