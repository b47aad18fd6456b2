"""zero_degree 1 and 2: Colossal-AI's LowLevelZero, optionally sharded per node and replicated across nodes.

ZeRO-1 shards the fp32 master weights and optimizer state over ``zero_group``; ZeRO-2 also
reduce-scatters the gradients so that each rank keeps only its shard of them. The model's working
weights stay whole (in the training dtype) on every rank.

Grouped ZeRO (``replica_group`` given) shards inside a node and keeps one replica of each shard
per node: the gradient is first averaged inside the node (Colossal-AI's reduction over
``zero_group``), then each rank averages its gradient *shard* with the ranks holding the same
shard on the other nodes (one all-reduce of 1/node_size of the gradients over the slow links).
Colossal-AI's own ``extra_dp_size`` is not this: it still shards over the whole world and only
splits the collective in two levels, the first of which reduce-scatters full gradient buckets
across nodes.
"""

from types import MethodType
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from colossalai.accelerator import get_accelerator
from colossalai.booster.plugin.low_level_zero_plugin import LowLevelZeroCheckpointIO, LowLevelZeroModel
from colossalai.checkpoint_io import CheckpointIndexFile
from colossalai.checkpoint_io.utils import (
    load_param_groups_into_optimizer,
    load_state_dict_shards,
    load_states_into_optimizer,
    sharded_optimizer_loading_epilogue,
)
from colossalai.zero import LowLevelZeroOptimizer
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import ProcessGroup
from torch.optim import Optimizer
from torch.utils._pytree import tree_map

from .devices import zero_degree_hint
from .fp32_inputs import kept_arguments, with_arguments
from .sync import broadcast_module_states


class ZeroOptimizer(LowLevelZeroOptimizer):
    """LowLevelZero whose sharded optimizer checkpoint also saves parameters that have no optimizer state
    yet. Colossal-AI's ``state_dict_shard`` looks up every parameter's state and fails on one that has
    never been stepped: a parameter without a gradient is left out of a step (its Adam state does not
    advance), which distillation does on purpose (each step trains the student or the critic). Such a
    parameter is saved with an empty state, which AdamW reads as "not stepped yet" when loaded."""

    def state_dict_shard(self, *args, **kwargs):
        stateless = [p for group in self.optim.param_groups for p in group["params"] if p not in self.optim.state]
        for p in stateless:
            self.optim.state[p] = {}
        try:
            yield from super().state_dict_shard(*args, **kwargs)
        finally:
            for p in stateless:
                if not self.optim.state.get(p, True):  # still empty: not stepped meanwhile
                    del self.optim.state[p]


class ReplicatedZeroOptimizer(ZeroOptimizer):
    """LowLevelZero sharded over ``dp_process_group`` and replicated over ``replica_group``.

    The cross-replica average runs once per optimizer step (not per backward), so gradient
    accumulation over several backward passes is averaged exactly once.
    """

    def __init__(self, optimizer: Optimizer, replica_group: ProcessGroup, **kwargs) -> None:
        super().__init__(optimizer, **kwargs)
        self.replica_group = replica_group

    def _average_shards_over_replicas(self) -> None:
        # Only this rank's working shard of each gradient is read by step() (norm and update).
        grads = [
            grad
            for store in self.pg_to_grad_store.values()
            for group_id in range(self.num_param_groups)
            for grad in store.get_working_grads_by_group_id(group_id)
        ]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.replica_group)
        flat.div_(dist.get_world_size(self.replica_group))
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(synced)

    def step(self, closure=None):
        if self.require_grad_sync:
            self._average_shards_over_replicas()
        return super().step(closure)


def check_zero_device() -> None:
    """LowLevelZero runs only on a CUDA/NPU accelerator: say so when the plugin is built rather
    than failing deep inside Colossal-AI at the first step."""
    if get_accelerator().name == "cpu":
        raise ValueError(f"zero_degree 1 and 2 (LowLevelZero) need a CUDA GPU and none is visible; "
                         f"{zero_degree_hint()}")


def shard_of(full: torch.Tensor, group_size: int, group_rank: int) -> torch.Tensor:
    """This rank's piece of ``full`` under ZeRO's per-tensor partition (flatten, zero-pad, split)."""
    flat = full.reshape(-1)
    flat = F.pad(flat, [0, -flat.numel() % group_size])
    return flat.chunk(group_size)[group_rank].clone()


class ZeroCheckpointIO(LowLevelZeroCheckpointIO):
    """LowLevelZero checkpoint IO that splits loaded optimizer states over each parameter's ZeRO group.

    Colossal-AI's version splits them over the whole world, which gives wrongly sized shards as
    soon as ZeRO shards over a smaller group (grouped ZeRO). Saved files are full, unsharded
    states, so they load at any world size and any grouping.
    """

    def load_sharded_optimizer(self, optimizer: LowLevelZeroOptimizer, index_file_path: str, prefix: str = None,
                               low_cpu_mem_mode: bool = True, num_threads: int = 1) -> None:
        index = CheckpointIndexFile.from_file(index_file_path)
        param_group_file = index.get_param_group_filename()
        if param_group_file is None:
            raise RuntimeError(f"optimizer index {index_file_path} names no param-group file; the checkpoint is "
                               f"incomplete")
        inner = optimizer.unwrap()
        id_map = load_param_groups_into_optimizer(inner, param_group_file)
        shard_files, _ = index.get_checkpoint_filenames()
        for states in load_state_dict_shards(shard_files, True, False, low_cpu_mem_mode):
            for param_idx, state in states.items():
                master = id_map[int(param_idx)]
                group = optimizer.param_to_pg[optimizer.master_to_working_param[id(master)]]
                size, rank = dist.get_world_size(group), dist.get_rank(group)
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":
                        state[key] = shard_of(value, size, rank)
            load_states_into_optimizer(inner, states, id_map)
        sharded_optimizer_loading_epilogue(inner)


def master_shards(module: nn.Module, optimizer: LowLevelZeroOptimizer) -> Dict[str, torch.Tensor]:
    """This rank's fp32 master shard of every trainable parameter of ``module``, by name."""
    masters = optimizer.working_to_master_param
    return {name: masters[id(p)] for name, p in module.named_parameters() if id(p) in masters}


def load_master_shards(module: nn.Module, optimizer: LowLevelZeroOptimizer, shards: Dict[str, torch.Tensor]) -> None:
    """Copy saved master shards (same ZeRO partition) into ``optimizer``'s fp32 masters; a missing
    name or a shard of another size raises naming the parameter."""
    masters = optimizer.working_to_master_param
    for name, p in module.named_parameters():
        if id(p) not in masters:
            continue
        if name not in shards:
            raise KeyError(f"no saved master shard for parameter {name!r}")
        saved, master = shards[name], masters[id(p)]
        if saved.shape != master.shape:
            raise ValueError(f"master shard of {name!r} has shape {tuple(saved.shape)}, this run's partition "
                             f"{tuple(master.shape)}: saved with another ZeRO grouping")
        master.data.copy_(saved.to(master.device))


class TimestepSafeZeroModel(LowLevelZeroModel):
    """LowLevelZero's model wrapper, except that the inputs the module declares in ``fp32_inputs``
    (diffusion timesteps: rectified-flow times x 1000 are fractional, and bf16 would round them to
    steps of up to 4) keep their dtype; every other float input is cast to the training dtype as
    Colossal-AI does. The module's timestep embedder then computes its frequencies in fp32."""

    def forward(self, *args, **kwargs):
        kept = kept_arguments(self.module, args, kwargs)
        if self.convert_fn is None or not kept:
            return super().forward(*args, **kwargs)
        args, kwargs = with_arguments(self.module, args, kwargs, kept, lambda v: tree_map(self.convert_fn, v))
        with self._hook_context():
            return self.module(*args, **kwargs)


def apply_low_level_zero(
    model: nn.Module,
    optimizer: Optional[Optimizer],
    *,
    stage: int,
    precision: str,
    zero_group: ProcessGroup,
    replica_group: Optional[ProcessGroup],
    max_norm: float,
    overlap_communication: bool,
    **zero_kwargs,
) -> Tuple[LowLevelZeroModel, Optional[LowLevelZeroOptimizer]]:
    """Cast ``model`` to ``precision`` on the current device, give it rank 0's weights, and wrap
    ``optimizer`` in ZeRO ``stage``.

    ``zero_group``: the ranks one copy of the master weights is sharded over; ``replica_group``:
    None, or the ranks holding the same shard (grouped ZeRO); ``max_norm``: clipping, 0 disables;
    ``overlap_communication``: reduce gradient buckets on a side CUDA stream during backward;
    ``zero_kwargs`` go to ``LowLevelZeroOptimizer`` (``reduce_bucket_size``,
    ``communication_dtype``, ``cpu_offload``, loss-scale settings, ...).
    """
    model = TimestepSafeZeroModel(model, precision)  # cast and moved to the current device
    broadcast_module_states(model.module, next(model.module.parameters()).device)
    if optimizer is None:
        return model, None
    kwargs = dict(
        partition_grad=(stage == 2), clip_grad_norm=max_norm, dp_process_group=zero_group,
        overlap_communication=overlap_communication, backward_context=model._hook_context, **zero_kwargs,
    )
    if replica_group is None:
        optimizer = ZeroOptimizer(optimizer, **kwargs)
    else:
        optimizer = ReplicatedZeroOptimizer(optimizer, replica_group, **kwargs)
    # Colossal-AI's checkpoint IO refreshes the master shards after loading weights through this.
    model.update_master_params = MethodType(optimizer.update_master_params, model)
    return model, optimizer
