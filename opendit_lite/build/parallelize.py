"""``parallelize_from_config``: the one place where a config's kernel, sequence-parallel,
activation-checkpointing and compile fields meet ``opendit_lite.transforms.parallelize``
(torchtitan's ``parallelize_<model>(model, job_config)``). The trainers, LiteGen and the samplers
call it; ``parallelize`` itself takes explicit arguments only."""

from typing import Optional

import torch.distributed as dist
import torch.nn as nn

from ..transforms import ParallelizeReport, parallelize


def parallelize_from_config(model: nn.Module, cfg, sp_group: Optional[dist.ProcessGroup], *,
                            sampling: bool = False) -> ParallelizeReport:
    """``parallelize(model, ...)`` with ``cfg``'s settings, over ``sp_group`` (the plugin's or the
    sampling mesh's sequence-parallel group; None: one rank).

    Training reads ``lora.*``, ``fused_adaln``, ``fused_layernorm``, ``attention_backend``, ``sp_mode``,
    ``sp_ring_size``, ``selective_ratio``, ``ac_offload``, ``compile`` and ``cuda_graphs``. With ``sampling`` the
    kernels and sequence parallelism are the same; no adapters are added (the sampler loads a run's
    adapters merged), no block is checkpointed (there is no backward whose activations would be
    saved), and ``sample.compile`` replaces ``compile`` (without CUDA graphs: sampled shapes vary
    with ``sample.*``)."""
    if sampling:
        selective_ratio, ac_offload, compile, cuda_graphs = 1.0, False, cfg.sample.compile, False
        lora = dict(lora_rank=0)
    else:
        selective_ratio, ac_offload = cfg.selective_ratio, cfg.ac_offload
        compile, cuda_graphs = cfg.compile, cfg.cuda_graphs
        lora = dict(lora_rank=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                    lora_targets=cfg.lora.targets)
    return parallelize(model, sp_group=sp_group, sp_mode=cfg.sp_mode, sp_ring_size=cfg.sp_ring_size,
                       fused_adaln=cfg.fused_adaln, fused_layernorm=cfg.fused_layernorm,
                       attention_backend=cfg.attention_backend,
                       selective_ratio=selective_ratio, ac_offload=ac_offload, compile=compile,
                       cuda_graphs=cuda_graphs, **lora)
