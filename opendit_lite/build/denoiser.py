"""The denoiser as sampling runs it: the config's settings for ``opendit_lite.transforms.parallelize``."""

from typing import Optional

import torch.distributed as dist
import torch.nn as nn

from ..transforms import ParallelizeReport, parallelize


def parallelize_denoiser(model: nn.Module, cfg, sp_group: Optional[dist.ProcessGroup]) -> ParallelizeReport:
    """The training transformations for sampling: the config's kernels, sequence parallelism over
    the sampling mesh's ``sp_group`` (``sp_mode``), and ``sample.compile``; no activation checkpointing."""
    return parallelize(model, sp_group=sp_group, sp_mode=cfg.sp_mode, sp_ring_size=cfg.sp_ring_size,
                       fused_adaln=cfg.fused_adaln, fused_layernorm=cfg.fused_layernorm,
                       attention_backend=cfg.attention_backend, compile=cfg.sample.compile)
