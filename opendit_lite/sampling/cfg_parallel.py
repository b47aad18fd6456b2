"""CFG-parallel sampling (``sample.cfg_parallel``): guidance's conditional and unconditional branches
computed by two groups of ranks.

Guidance runs the model once per step on a doubled batch of 2B rows, conditional first
(``models/cfg_layouts.py``). Here the ranks of ``cfg_rank`` 0 run the model on the first B rows and
their twins of ``cfg_rank`` 1 on the last B (each group may itself be sequence-parallel), and one
all-gather per step over each pair of twins puts the 2B predictions back together on both: the
guidance arithmetic and the sampler's update then see the values one process computes, so both
groups follow one process's trajectory (equal up to the float reassociation of a batch of B rows
instead of 2B). Only the predictions travel; the sampler's state is never exchanged.
"""

from typing import Callable, Optional

import torch
import torch.distributed as dist

from ..errors import ConfigError
from ..models.capabilities import guidance_distilled, guidance_layout


def check_cfg_parallel(model, cfg_scale: float) -> None:
    """A ConfigError when CFG-parallel ranks would have nothing to split: a model without guided
    forward or distilled from guidance (it takes the scale as an input: no unconditional branch),
    or a ``cfg_scale`` that leaves one branch unused (1: the conditional prediction alone, 0: the
    unconditional one)."""
    name = type(getattr(model, "model", model)).__name__
    if guidance_layout(model) is None or guidance_distilled(model):
        why = ("is distilled from classifier-free guidance (it takes the guidance scale as an input)"
               if guidance_distilled(model) else "declares no guided forward (guidance_layout)")
        raise ConfigError(f"sample.cfg_parallel splits classifier-free guidance's conditional and unconditional "
                          f"branches over two groups of ranks, but {name} {why}, so it has no unconditional branch "
                          f"to compute. Set sample.cfg_parallel=false and use the ranks for data or sequence "
                          f"parallelism (sp_size).")
    if cfg_scale in (0.0, 1.0):
        used = "conditional" if cfg_scale == 1.0 else "unconditional"
        raise ConfigError(f"sample.cfg_parallel with sample.cfg_scale={cfg_scale:g}: guidance then returns the {used} "
                          f"prediction alone, so half of the ranks would compute a branch that is thrown away. Set "
                          f"sample.cfg_parallel=false (and use the ranks for data or sequence parallelism), or a "
                          f"cfg_scale other than 0 and 1.")


class BranchSplit:
    """Runs ``model`` on this rank's half of every doubled-batch call (``branch`` 0: the first half,
    the conditional rows; 1: the second) and returns the whole [2B, ...] output, gathered over
    ``group`` (this rank and its twin). Attributes (``null_caption``, ...) are the model's."""

    def __init__(self, model: Callable[..., torch.Tensor], group: Optional[dist.ProcessGroup], branch: int):
        self.model, self.group, self.branch = model, group, branch

    def _half(self, value, rows: int):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows:
            half = rows // 2
            return value[self.branch * half:(self.branch + 1) * half]
        return value

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        rows = x.shape[0]  # 2B: [conditional; unconditional]; every batched argument has as many rows
        out = self.model(self._half(x, rows), *(self._half(a, rows) for a in args),
                         **{k: self._half(v, rows) for k, v in kwargs.items()})                  # [B, ...]
        out = out.contiguous()
        parts = [torch.empty_like(out) for _ in range(2)]
        dist.all_gather(parts, out, group=self.group)                                            # 2 x [B, ...]
        return torch.cat(parts)                                                                  # [2B, ...]

    def __getattr__(self, name: str):
        return getattr(self.model, name)
