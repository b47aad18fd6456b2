"""``parallelize_from_config``: the one place where a config's kernel, sequence-parallel,
activation-checkpointing and compile fields meet ``opendit_lite.parallelization.parallelize``
(torchtitan's ``parallelize_<model>(model, job_config)``). The trainers, LiteGen and the samplers
call it; ``parallelize`` itself takes explicit arguments only."""

import os
from typing import Optional

import torch.distributed as dist
import torch.nn as nn

from ..parallel import Links
from ..parallelization import ParallelizeReport, parallelize
from .geometry import sp_auto_inputs


def parallelize_from_config(model: nn.Module, cfg, sp_group: Optional[dist.ProcessGroup], *,
                            sampling: bool = False) -> ParallelizeReport:
    """``parallelize(model, ...)`` with ``cfg``'s settings, over ``sp_group`` (the plugin's or the
    sampling mesh's sequence-parallel group; None: one rank).

    Training reads ``lora.*`` (``lora.base_precision`` too), ``memory.blocks_to_swap``, ``fused_adaln``,
    ``fused_layernorm``, ``attention_backend``, ``sp_mode``
    (``auto``: decided from the config's largest bucket and the node layout, ``LOCAL_WORLD_SIZE`` ranks per
    node, as ``python -m opendit_lite.plan`` decides), ``sp_ring_size``, ``selective_ratio``, ``ac_offload``,
    ``compile`` and ``cuda_graphs``. With ``sampling`` the kernels and sequence parallelism are the same;
    no adapters are added (the sampler loads a run's adapters merged), no block is swapped or checkpointed (there is
    no backward whose activations would be saved), and ``sample.compile`` replaces ``compile`` (without
    CUDA graphs: sampled shapes vary with ``sample.*``)."""
    if sampling:
        selective_ratio, ac_offload, compile, cuda_graphs = 1.0, False, cfg.sample.compile, False
        lora = dict(lora_rank=0, base_precision="none", blocks_to_swap=0)
    else:
        selective_ratio, ac_offload = cfg.selective_ratio, cfg.ac_offload
        compile, cuda_graphs = cfg.compile, cfg.cuda_graphs
        # a distillation module already carries its two adapters (builders/distill_model.py)
        distill = getattr(cfg, "distill", None)
        rank = 0 if distill is not None and distill.teacher else cfg.lora.rank
        lora = dict(lora_rank=rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                    lora_targets=cfg.lora.targets, base_precision=cfg.lora.base_precision,
                    blocks_to_swap=cfg.memory.blocks_to_swap)
    sp_auto = None
    if cfg.sp_mode == "auto" and sp_group is not None and dist.get_world_size(sp_group) > 1:
        # The run's largest bucket and its node layout: the numbers the planner decides from too.
        ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", Links().ranks_per_node))
        # A module of several networks (Wan 2.2's experts, a pipeline distillation's) declares them; they share
        # one architecture, so the first stands for all.
        networks = getattr(model, "sequence_parallel_networks", None)
        one = networks()[0][1] if networks is not None else model
        sp_auto = sp_auto_inputs(one, cfg, dist.get_world_size(sp_group), ranks_per_node)
    return parallelize(model, sp_group=sp_group, sp_mode=cfg.sp_mode, sp_ring_size=cfg.sp_ring_size,
                       sp_auto=sp_auto,
                       fused_adaln=cfg.fused_adaln, fused_layernorm=cfg.fused_layernorm,
                       attention_backend=cfg.attention_backend,
                       selective_ratio=selective_ratio, ac_offload=ac_offload, compile=compile,
                       cuda_graphs=cuda_graphs, **lora)
