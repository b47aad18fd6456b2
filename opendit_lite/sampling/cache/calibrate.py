"""MagCache's calibration: the magnitude ratio of the block stack's residual between consecutive
steps, measured on one trajectory sampled in full.

The ratio of step i is diffusers' (``MagCacheBlockHook``'s calibration): the mean over tokens of
``|r_i| / |r_(i-1)|``, norms over the channels, with 1 at the first step. diffusers measures it on one
rank's tensors and prints it; here the sum and count of the per-token ratios are all-reduced over the
ranks that share the batch, so every rank gets the ratios of the whole batch and skips alike.
"""

from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from diffusers.hooks.hooks import HookRegistry, ModelHook

from .model_parts import block_metadata


class _Head(ModelHook):
    def __init__(self, calibration: "MagCalibration"):
        super().__init__()
        self.calibration = calibration

    def pre_forward(self, module, *args, **kwargs):
        meta = block_metadata(type(module))
        self.calibration.head_input = meta._get_parameter_from_args_kwargs(meta.hidden_states_argument_name, args,
                                                                           kwargs)
        return args, kwargs


class _Tail(ModelHook):
    def __init__(self, calibration: "MagCalibration"):
        super().__init__()
        self.calibration = calibration

    def post_forward(self, module, output):
        meta = block_metadata(type(module))
        hidden = output[meta.return_hidden_states_index] if isinstance(output, tuple) else output
        self.calibration.step(hidden - self.calibration.head_input)
        return output


class MagCalibration:
    """Records the ratio of each step of one trajectory (``ratios``) from hooks on the first and the
    last block; ``finish()`` returns them."""

    def __init__(self, head: nn.Module, tail: nn.Module, group: Optional[dist.ProcessGroup]):
        self.head, self.tail, self.group = head, tail, group
        self.head_input: Optional[torch.Tensor] = None
        self.previous: Optional[torch.Tensor] = None
        self.ratios: List[float] = []

    def reset(self) -> None:
        """Forget a trajectory that did not finish (the next one calibrates from its first step)."""
        self.head_input = self.previous = None
        self.ratios = []

    def install(self, name: str) -> None:
        HookRegistry.check_if_exists_or_initialize(self.head).register_hook(_Head(self), name)
        HookRegistry.check_if_exists_or_initialize(self.tail).register_hook(_Tail(self), name)

    def step(self, residual: torch.Tensor) -> None:
        if self.previous is None:
            self.ratios.append(1.0)
        else:
            ratio = torch.linalg.norm(residual.float(), dim=-1) / (torch.linalg.norm(self.previous.float(), dim=-1)
                                                                   + 1e-8)                     # per token
            sums = torch.stack([ratio.sum(dtype=torch.float64),
                                torch.tensor(ratio.numel(), dtype=torch.float64, device=ratio.device)])
            if self.group is not None:
                dist.all_reduce(sums, group=self.group)
            total, count = sums.tolist()
            self.ratios.append(total / count)
        self.previous = residual

    def finish(self) -> List[float]:
        return list(self.ratios)
