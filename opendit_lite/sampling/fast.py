"""What makes a sampling run compute less than one plain process: CFG-parallel ranks
(``cfg_parallel.py``) and a step cache (``cache/``). ``fast_sampling`` checks and sets them up once per
run, on the loaded denoiser; ``FastSampling.guided`` gives each trajectory its guided model and
``FastSampling.trajectory`` brackets it (a step cache starts every trajectory empty)."""

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist

from ..diffusion import cfg_model_fn
from ..errors import ConfigError
from ..families import FamilyDenoiser
from .cache import StepCache, apply_step_cache, resolve_cache
from .cfg_parallel import BranchSplit, check_cfg_parallel
from .sharding import SamplingRanks


@dataclass
class FastSampling:
    """``branches``: (this rank's CFG pair group, its branch 0 or 1), None without CFG-parallel ranks;
    ``cache``: the step cache, None without."""

    branches: Optional[Tuple[Optional[dist.ProcessGroup], int]] = None
    cache: Optional[StepCache] = None

    def guided(self, model, cfg_scale: float, channels: Optional[int] = None) -> Callable[..., torch.Tensor]:
        """``cfg_model_fn(model, ...)`` run through this rank's branch and the step cache's record."""
        runner = model
        if self.branches is not None:
            runner = BranchSplit(runner, *self.branches)
        if self.cache is not None:
            runner = self.cache.track(runner)
        return cfg_model_fn(model, cfg_scale, channels=channels, runner=None if runner is model else runner)

    def trajectory(self):
        """Context of one sampling trajectory."""
        return self.cache.trajectory() if self.cache is not None else nullcontext()


PLAIN = FastSampling()


def fast_sampling(denoiser, cfg, ranks: SamplingRanks) -> FastSampling:
    """``sample.cfg_parallel`` and ``sample.cache`` for ``denoiser`` (a zoo model, or a family's
    ``FamilyDenoiser``) loaded for sampling on ``ranks``: checked (ConfigError when they cannot apply)
    and set up. A step cache's hooks go into the model; rank 0 prints what the cache does."""
    s = cfg.sample
    settings = resolve_cache(s.cache)
    if s.cfg_parallel:
        check_cfg_parallel(denoiser, s.cfg_scale)
    if settings["kind"] != "none" and s.compile:
        raise ConfigError(f"sample.cache.kind={settings['kind']} with sample.compile=true: the cache decides in "
                          f"Python at every step, around the blocks that compile would trace. Use one of the two.")
    module = denoiser.model if isinstance(denoiser, FamilyDenoiser) else denoiser
    cache = apply_step_cache(module, settings, num_steps=s.num_sampling_steps,
                             num_timesteps=cfg.diffusion.diffusion_steps, group=ranks.batch_group,
                             announce=print if ranks.is_main else (lambda message: None))
    branches = (ranks.cfg_group, ranks.cfg_rank) if ranks.cfg_size == 2 else None
    return FastSampling(branches, cache)
