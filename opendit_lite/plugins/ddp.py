"""zero_degree 0: PyTorch DDP with fp32 weights, autocast for bf16/fp16, loss scaling and clipping.

DDP keeps one full fp32 copy of the weights, gradients and optimizer state per rank; bf16/fp16
only changes the compute dtype (``torch.autocast`` around the forward), so the optimizer always
updates fp32 weights. fp16 needs a loss scale (its exponent range is too small for gradients);
bf16 does not. Gradients are averaged over the whole world by DDP's all-reduce.

The model wrapper subclasses Colossal-AI's ``TorchDDPModel`` so that its checkpoint IO and
``Booster.no_sync`` (gradient accumulation without the all-reduce) work unchanged.
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn
from colossalai.booster.plugin.torch_ddp_plugin import TorchDDPModel
from colossalai.interface import OptimizerWrapper
from torch.optim import Optimizer


class AutocastDDPModel(TorchDDPModel):
    """DDP-wrapped model whose forward runs under ``torch.autocast(dtype)`` (None: plain fp32)."""

    def __init__(self, module: nn.Module, dtype: Optional[torch.dtype], **ddp_kwargs) -> None:
        super().__init__(module, **ddp_kwargs)
        self.dtype = dtype
        self.device_type = next(module.parameters()).device.type

    def forward(self, *args, **kwargs):
        with torch.autocast(device_type=self.device_type, dtype=self.dtype, enabled=self.dtype is not None):
            return self.module(*args, **kwargs)


class AMPOptimizer(OptimizerWrapper):
    """Optimizer wrapper for DDP: optional fp16 loss scaling, then gradient-norm clipping, per step.

    Clipping needs true gradients, so with a scaler the gradients are unscaled first; without
    clipping the scaler unscales inside ``step`` (fused optimizers take the scale directly).
    """

    def __init__(self, optim: Optimizer, max_norm: float = 0.0, scaler: Optional[torch.amp.GradScaler] = None):
        super().__init__(optim)
        self.max_norm = max_norm
        self.scaler = scaler
        self._grad_norm: Optional[float] = None

    def backward(self, loss: torch.Tensor, inputs=None, retain_graph: bool = False, **kwargs) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(inputs=inputs, retain_graph=retain_graph, **kwargs)

    def step(self, *args, **kwargs):
        if self.max_norm > 0:
            if self.scaler is not None:
                self.scaler.unscale_(self.optim)
            self._grad_norm = nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        if self.scaler is None:
            return self.optim.step(*args, **kwargs)
        out = self.scaler.step(self.optim, *args, **kwargs)
        self.scaler.update()
        return out

    def get_grad_norm(self, norm_type=2.0, **kwargs) -> Optional[float]:
        """The pre-clipping gradient norm of the last step (None when clipping is off)."""
        return None if self._grad_norm is None else float(self._grad_norm)


def apply_ddp(
    model: nn.Module,
    optimizer: Optional[Optimizer],
    *,
    device: torch.device,
    dtype: Optional[torch.dtype],
    max_norm: float,
    **ddp_kwargs,
) -> Tuple[AutocastDDPModel, Optional[AMPOptimizer]]:
    """Move ``model`` to ``device``, wrap it in DDP (world group) and ``optimizer`` in ``AMPOptimizer``.

    ``dtype``: autocast dtype (``torch.bfloat16``/``torch.float16``) or None for fp32;
    ``max_norm``: gradient clipping threshold, 0 disables; ``ddp_kwargs`` go to
    ``torch.nn.parallel.DistributedDataParallel`` (e.g. ``find_unused_parameters``).
    """
    model = AutocastDDPModel(model.to(device), dtype, **ddp_kwargs)
    if optimizer is not None:
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        optimizer = AMPOptimizer(optimizer, max_norm=max_norm, scaler=scaler)
    return model, optimizer
