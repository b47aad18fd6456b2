"""The denoiser as sampling runs it: the training transformations of ``opendit_lite.parallelize``."""

import torch.nn as nn

from ..parallelize import ParallelizeReport, parallelize
from .ranks import SamplingRanks


def parallelize_denoiser(model: nn.Module, cfg, ranks: SamplingRanks) -> ParallelizeReport:
    """The training transformations for sampling: the config's kernels, sequence parallelism over
    the sampling mesh's group (``sp_mode``), and ``sample.compile``; no activation checkpointing."""
    return parallelize(model, sp_group=ranks.sp_group, sp_mode=cfg.sp_mode, fused_adaln=cfg.fused_adaln,
                       fused_layernorm=cfg.fused_layernorm, attention_backend=cfg.attention_backend,
                       compile=cfg.sample.compile)
