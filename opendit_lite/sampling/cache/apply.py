"""``apply_step_cache``: a step cache's hooks on a denoiser, and ``StepCache``, the handle the sampler
drives (one trajectory at a time) and reads (what was computed at every step)."""

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from diffusers.hooks import PyramidAttentionBroadcastConfig, apply_pyramid_attention_broadcast
from diffusers.hooks.first_block_cache import FBCBlockHook, FBCSharedBlockState
from diffusers.hooks.hooks import CacheContext, HookRegistry, StateManager
from diffusers.hooks.mag_cache import MagCacheBlockHook, MagCacheConfig, MagCacheHeadHook, MagCacheState
from diffusers.hooks.pyramid_attention_broadcast import PyramidAttentionBroadcastHook
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_processor import Attention as DiffusersAttention

from ...errors import ConfigError
from ...families import family_of, is_family
from .cache_hooks import (
    AgreedFirstBlockHook,
    CountingHook,
    FirstBlockTailHook,
    ReuseNotice,
    Tally,
    TeaCacheHeadHook,
    TeaCacheState,
)
from .calibrate import MagCalibration
from .model_parts import attention_kinds, cache_blocks, check_blocks, teacache_signal

HEAD, BLOCK, COUNT, CALIBRATE, NOTICE = ("step_cache_head", "step_cache_block", "step_cache_count",
                                         "step_cache_calibrate", "step_cache_reuse_notice")


@dataclass
class StepRecord:
    """One model call of a trajectory: its timestep (0-1000 scale) and how many block and attention
    forwards really ran in it."""

    timestep: float
    blocks: int
    attention: int


class StepCache:
    """A denoiser with a step cache (``apply_step_cache``). The sampler wraps each trajectory in
    ``trajectory()`` (the caches' state starts empty) and calls the model through ``track(fn)``
    (each call is one step: its timestep feeds Pyramid Attention Broadcast's window, and what ran is
    recorded in ``steps``). ``num_blocks`` / ``num_attention`` are the forwards of one full step."""

    def __init__(self, model: nn.Module, settings: Dict[str, Any], num_steps: int, num_timesteps: int,
                 group: Optional[dist.ProcessGroup], announce: Callable[[str], None]):
        self.model, self.settings, self.kind = model, settings, settings["kind"]
        self.num_steps, self.num_timesteps, self.group, self.announce = num_steps, num_timesteps, group, announce
        self.tally, self.timestep = Tally(), 1000.0
        self.steps: List[StepRecord] = []       # this trajectory's
        self.calls = self.blocks_run = self.attention_run = 0  # over all trajectories
        self.state_managers: List[StateManager] = []
        self.calibration: Optional[MagCalibration] = None
        self.num_blocks = self.num_attention = 0

    # -- driving ----------------------------------------------------------------------------------

    @contextmanager
    def trajectory(self) -> Iterator[None]:
        """One sampling trajectory: every cache state starts empty; a MagCache calibration that ends
        with it installs MagCache with the measured ratios for the following ones."""
        HookRegistry.check_if_exists_or_initialize(self.model).reset_stateful_hooks()
        for manager in self.state_managers:
            manager.set_context(CacheContext("inference"))
        if self.calibration is not None:
            self.calibration.reset()
        self.steps = []
        yield
        self.calls += len(self.steps)
        self.blocks_run += sum(step.blocks for step in self.steps)
        self.attention_run += sum(step.attention for step in self.steps)
        if self.calibration is not None and len(self.calibration.ratios) == self.num_steps:
            ratios, self.calibration = self.calibration.finish(), None
            _remove_hook(self.model, CALIBRATE)
            self.settings = {**self.settings, "mag_ratios": ratios}
            self._install_magcache()
            self.announce(f"MagCache calibrated on this batch (sampled in full); later batches skip steps with "
                          f"these ratios. Pass them to skip from the first batch: "
                          f"sample.cache.mag_ratios=[{','.join(f'{r:.4f}' for r in ratios)}]")

    def track(self, fn: Callable[..., torch.Tensor]) -> "Tracked":
        """``fn`` (the model, as the guidance calls it: ``fn(x, t, ...)``) recording each call's timestep
        and what it computed; its attributes are ``fn``'s."""
        return Tracked(fn, self)

    def summary(self) -> str:
        """What the cache saved over the trajectories so far, in one line."""
        if self.kind == "pab":
            total, run, what = self.calls * self.num_attention, self.attention_run, "attention"
        else:
            total, run, what = self.calls * self.num_blocks, self.blocks_run, "block"
        share = f"{run / total:.0%}" if total else "none"
        return (f"step cache {self.kind}: {run} of {total} {what} forwards computed ({share}) over {self.calls} "
                f"model calls")

    # -- hooks ------------------------------------------------------------------------------------

    def _count(self, modules: List[nn.Module], field: str) -> None:
        for module in modules:
            HookRegistry.check_if_exists_or_initialize(module).register_hook(CountingHook(self.tally, field), COUNT)

    def _state(self, state_cls) -> StateManager:
        manager = StateManager(state_cls)
        manager.set_context(CacheContext("inference"))
        self.state_managers.append(manager)
        return manager

    def _install_pab(self) -> None:
        s = self.settings
        window = tuple(s["timesteps"])
        if is_family(self.model):  # diffusers' own classification of its attention modules
            modules = [m for m in self.model.modules() if isinstance(m, (AttentionModuleMixin, DiffusersAttention))]
            self._count(modules, "attention")
            apply_pyramid_attention_broadcast(self.model, PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=s["spatial_skip"],
                temporal_attention_block_skip_range=s["temporal_skip"],
                cross_attention_block_skip_range=s["cross_skip"], spatial_attention_timestep_skip_range=window,
                temporal_attention_timestep_skip_range=window, cross_attention_timestep_skip_range=window,
                current_timestep_callback=lambda: self.timestep))
            self.num_attention = len(modules)
            return
        found = attention_kinds(self.model)
        if not found:
            raise ConfigError(f"sample.cache.kind=pab cannot hook {type(self.model).__name__}: none of its attention "
                              f"modules declares its attention_kind (spatial, temporal or cross), so Pyramid Attention "
                              f"Broadcast cannot tell which outputs to reuse. Use another sample.cache.kind.")
        self._count([m for _, m, _ in found], "attention")
        for _, module, kind in found:
            hook = PyramidAttentionBroadcastHook(window, s[f"{kind}_skip"], lambda: self.timestep)
            HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, HEAD)
        self.num_attention = len(found)

    def _install_blocks(self) -> List[nn.Module]:
        blocks = cache_blocks(self.model)
        check_blocks(self.model, blocks, self.kind)
        self._count(blocks, "blocks")
        self.num_blocks = len(blocks)
        return blocks

    def _install_first_block(self, blocks: List[nn.Module]) -> None:
        if len(blocks) < 2:
            raise ConfigError(f"sample.cache.kind=first_block skips the blocks after the first, and "
                              f"{type(self.model).__name__} has one block: use kind=teacache or magcache.")
        state = self._state(FBCSharedBlockState)
        _register(blocks[0], AgreedFirstBlockHook(state, self.settings["threshold"], self.group), HEAD)
        for block in blocks[1:-1]:
            _register(block, FBCBlockHook(state), BLOCK)
        _register(blocks[-1], FirstBlockTailHook(state), BLOCK)

    def _install_teacache(self, blocks: List[nn.Module]) -> None:
        signal = teacache_signal(self.model, blocks[0])  # a ConfigError when the model has none
        state = self._state(TeaCacheState)
        steps = MagCacheConfig(mag_ratios=[1.0], num_inference_steps=self.num_steps)  # the tail's step count only
        self._register_stack(blocks, state, steps, TeaCacheHeadHook(
            state, self.settings["threshold"], self.settings["max_skip_steps"], self.num_steps, signal, self.group))

    def _install_magcache(self) -> None:
        s, blocks = self.settings, cache_blocks(self.model)
        config = MagCacheConfig(threshold=s["threshold"], max_skip_steps=s["max_skip_steps"],
                                retention_ratio=s["retention_ratio"], num_inference_steps=self.num_steps,
                                mag_ratios=list(s["mag_ratios"]))
        state = self._state(MagCacheState)
        self._register_stack(blocks, state, config, MagCacheHeadHook(state, config))

    def _register_stack(self, blocks: List[nn.Module], state: StateManager, config: MagCacheConfig, head) -> None:
        """MagCache's layout: the block hooks (the last one the tail), then the head hook on the first
        block, outermost (a one-block model carries both)."""
        for i, block in enumerate(blocks):
            if i > 0 or len(blocks) == 1:
                _register(block, MagCacheBlockHook(state, is_tail=i == len(blocks) - 1, config=config), BLOCK)
        _register(blocks[0], head, HEAD)


class Tracked:
    """A model call recorded by a ``StepCache`` (``StepCache.track``)."""

    def __init__(self, fn: Callable[..., torch.Tensor], cache: StepCache):
        self.fn, self.cache = fn, cache

    def __call__(self, x: torch.Tensor, t: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        cache = self.cache
        cache.timestep = float(t.reshape(-1)[0]) * 1000.0 / cache.num_timesteps  # what PAB's window reads
        blocks, attention = cache.tally.blocks, cache.tally.attention
        out = self.fn(x, t, *args, **kwargs)
        cache.steps.append(StepRecord(cache.timestep, cache.tally.blocks - blocks, cache.tally.attention - attention))
        return out

    def __getattr__(self, name: str):
        return getattr(self.fn, name)


def _register(module: nn.Module, hook, name: str) -> None:
    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, name)


def _remove_hook(model: nn.Module, name: str) -> None:
    HookRegistry.check_if_exists_or_initialize(model).remove_hook(name, recurse=True)


def apply_step_cache(model: nn.Module, settings: Dict[str, Any], *, num_steps: int, num_timesteps: int,
                     group: Optional[dist.ProcessGroup] = None,
                     announce: Callable[[str], None] = print) -> Optional[StepCache]:
    """Hook the step cache ``settings`` (``resolve_cache``'s) into ``model`` (a zoo model or a diffusers
    family's transformer, after ``parallelize``) for trajectories of ``num_steps`` model calls whose
    timesteps run over ``0..num_timesteps``; decisions that depend on the tensors are agreed over
    ``group``, every rank that holds part of the batch. None for kind "none". ``announce`` prints
    what the cache did (rank 0's print; a no-op elsewhere). A model the kind cannot hook is a
    ConfigError."""
    if settings["kind"] == "none":
        return None
    family = family_of(model)
    if family is not None and family.step_cache.no_cache:
        raise ConfigError(f"sample.cache.kind={settings['kind']} cannot hook {type(model).__name__}: "
                          f"{family.step_cache.no_cache} Use sample.cache.kind=none.")
    cache = StepCache(model, settings, num_steps, num_timesteps, group, announce)
    sp_state = getattr(model, "sequence_parallel_state", None)  # a diffusers model under sequence parallelism
    if sp_state is not None:
        field = "attention" if cache.kind == "pab" else "blocks"
        _register(model, ReuseNotice(cache.tally, field, lambda: getattr(cache, f"num_{field}"), sp_state), NOTICE)
    if cache.kind == "pab":
        cache._install_pab()
        return cache
    blocks = cache._install_blocks()
    if cache.kind == "first_block":
        cache._install_first_block(blocks)
    elif cache.kind == "teacache":
        cache._install_teacache(blocks)
    elif settings["mag_ratios"] is not None:
        cache._install_magcache()
    else:
        cache.calibration = MagCalibration(blocks[0], blocks[-1], group)
        cache.calibration.install(CALIBRATE)
        announce(f"MagCache: no sample.cache.mag_ratios given, so the first batch is sampled in full to calibrate "
                 f"them ({num_steps} steps); later batches skip steps.")
    return cache
