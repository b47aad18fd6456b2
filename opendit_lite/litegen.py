"""LiteGen-compatible facade: one object built from a config, one ``initialize`` call.

    gen = LiteGen(config)                   # a dict, an EasyDict, a namespace or a TrainConfig
    model, optimizer, text_encoder, dataloader, vae_encode = gen.initialize(
        model, optimizer, text_encoder, dataset, vae.encode)
    for step, batch in ...:
        ...
        gen.update_ema(model)                   # decay: ema.decay of the config, warmed up (or decay=...)
        if step % every == 0:
            gen.save_model(step=step); gen.save_optimizer(step=step); gen.save_ema(step=step)
            # or everything at once (LR scheduler, RNG, epoch/sampler position, config):
            gen.save_checkpoint(step, extra_state={"epoch": epoch})

A thin facade over the pieces the scripts use: the config is read once into the typed
:class:`~opendit_lite.config.TrainConfig` by ``config.from_object`` (aliases resolved, validated;
an unknown key is a ConfigError naming the nearest field, or with ``LiteGen(config,
strict=False)`` a warning listing the keys it ignores); the plugin and booster come from
``training.loop.build_booster`` (the precision resolved once, ``gen.plugin.precision``: ``auto`` is
bf16 on CUDA, fp32 on CPU; tf32; ``grad_precision`` check); the model is prepared by
``opendit_lite.builders.parallelize.parallelize_from_config`` as in train.py, whose report
(``gen.parallelize_report``) is printed on rank 0; checkpoints follow ``checkpoint.layout`` and
resuming is ``checkpoint.resume.restore_run``, as in train.py. Without ``torchrun`` the one-rank
process group is created here (``distributed.process_group.init_distributed``).

``initialize(*components)`` returns the components in the order given, each prepared by kind:

- the one trainable ``nn.Module`` (any parameter with ``requires_grad``; zero or several are an
  error): ``parallelize_from_config`` with the config's settings (fused kernels, attention
  backend, Ulysses/ring/USP/DSP sequence parallelism when ``sp_size > 1``, activation checkpointing/offload
  from ``selective_ratio``, the fraction of blocks NOT checkpointed, and ``ac_offload``, per-block
  ``compile`` with ``cuda_graphs``, in that order; see ``opendit_lite/parallelization.py`` for why), then
  boosted with its optimizer and LR scheduler (with ``lora.rank``, an optimizer built on the
  model's weights before the adapters were added is pointed at the adapters:
  ``adapt_optimizer_to_lora``). Then the weights are loaded (see below) and the EMA is created from
  them (``ema.enable``), so it starts from the loaded weights; ``update_ema`` warms its decay up for
  LoRA (``ema.warmup``);
- its ``torch.optim.Optimizer`` and optional ``LRScheduler``: boosted with it;
- frozen modules (no trainable parameter): moved to this rank's device; with ``encoder.fsdp``
  sharded by torch FSDP (FULL_SHARD, for inference) over the world or, with ``encoder.group``,
  within each node;
- a ``Dataset``: a DataLoader sharded over the data-parallel ranks, ``global_batch_size //
  (dp_size * grad_accum_steps)`` samples per rank and micro-batch (``builders.batch.micro_batch_size``);
- any other callable (e.g. ``vae.encode``): wrapped by ``torch.compile``, falling back to the eager
  callable when compilation is unavailable or fails on the first call. A method stays bound to
  its original module: pass ``vae.encode`` or ``vae``, not both with ``encoder.fsdp`` (the FSDP
  wrapper would own the module's parameters, the bound method would not see them).

Loading, in increasing priority (as LiteGen): ``init_from`` (weights only, a fresh start);
``resume_from`` (weights and optimizer state, from a model file saved by ``save_model`` with its
``.optim_state.pth`` next to it, or a ``save_checkpoint`` folder, which also restores the LR
scheduler, RNG and extra state; the EMA from ``ema.resume_from`` when given, else from such a
folder); ``auto_resume`` (only when ``resume_from`` is empty: the newest complete checkpoint of
``exp_name`` in the checkpoint folder, of either kind, with its EMA; falls back to ``init_from``
when there is none). ``gen.resume_state`` holds what a resume restored (``step`` and the saved
extra state).

Files: the checkpoint folder is ``checkpoint_dir``, by default ``<results_dir>/<exp_name>/checkpoints``
as for train.py (set ``checkpoint_dir`` to ``results_dir`` for LiteGen's flat layout); an
``output_folder`` argument overrides it per call. Names are LiteGen's: ``filename`` when given, else
``[exp_name].pth``, ``[exp_name].optim_state.pth`` and ``[exp_name].ema.pth``, with
``[exp_name]_step[N]`` as the prefix when ``step`` is given. The model and EMA files are single torch
state dicts (the EMA in fp32); the optimizer file is a single file under DDP and a *folder* of shards
under ZeRO (one rank never holds the whole optimizer state). Every one is written under a temporary
name and renamed when complete. ``sample.py`` reads both kinds (``sample.ckpt=<folder or .pth>``, or
the newest of the run by default; with its EMA).
"""

import logging
import sys
from functools import partial
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import Dataset

from .builders.batch import micro_batch_size
from .builders.parallelize import parallelize_from_config
from .checkpoint.files import atomic_path
from .checkpoint.layout import checkpoint_root, companion_path, litegen_path, pick_resume_checkpoint
from .checkpoint.resume import restore_run
from .checkpoint.save_restore import load_model_weights, save_checkpoint
from .config import from_object, to_dict, validate_world
from .distributed.mesh import node_group
from .distributed.process_group import init_distributed
from .ema import ema_decay, ema_horizon_note, ema_warmup_on
from .parallelization import ParallelizeReport
from .training.loop import build_booster

__all__ = ["LiteGen", "CompiledFunction", "classify_components", "companion_path", "litegen_path"]

logger = logging.getLogger(__name__)

# FSDP unit size for frozen encoders: blocks of at least this many parameters are gathered one at
# a time (T5-XXL's ~200M-parameter blocks), smaller models (CLIP text towers) as one unit.
FSDP_MIN_UNIT_PARAMS = 100_000_000


# --------------------------------------------------------------------------------------------------
# Per-kind preparation
# --------------------------------------------------------------------------------------------------

def apply_frozen_fsdp(module: nn.Module, group, device: torch.device) -> nn.Module:
    """Shard a frozen module's parameters over ``group`` with torch FSDP (FULL_SHARD) for inference.

    Submodules of at least ``FSDP_MIN_UNIT_PARAMS`` parameters become their own FSDP units, so a
    forward gathers one block at a time instead of the whole model.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    return FullyShardedDataParallel(
        module, process_group=group, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=device,
        auto_wrap_policy=partial(size_based_auto_wrap_policy, min_num_params=FSDP_MIN_UNIT_PARAMS),
    )


def adapt_optimizer_to_lora(optimizer: Optimizer, model: nn.Module) -> None:
    """Point an optimizer built on ``model``'s parameters before ``lora.rank`` added adapters (and froze
    the rest) at the adapters: it would otherwise step only frozen weights, which get no gradient, and
    the run would train nothing. One parameter group keeps its settings; several are refused (which
    group an adapter belongs to is the user's choice)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in trainable}:
        return  # already built on the adapters
    if len(optimizer.param_groups) != 1:
        raise ValueError(f"lora.rank is set: initialize added LoRA adapters and froze the other weights, but the "
                         f"optimizer has {len(optimizer.param_groups)} parameter groups, so which "
                         f"group each adapter joins is not known; build it with one group, or on the adapters "
                         f"after opendit_lite.parallelize(model, lora_rank=...)")
    optimizer.param_groups[0]["params"] = trainable
    optimizer.state.clear()


class CompiledFunction:
    """``torch.compile(fn)`` that falls back to ``fn`` itself when compiling is unavailable, or when
    the first call fails; later calls then run eagerly (a failure of ``fn`` itself re-raises from
    the eager call, with its own traceback)."""

    def __init__(self, fn: Callable) -> None:
        self.eager = fn
        self.checked = False
        try:
            self.compiled: Optional[Callable] = torch.compile(fn)
        except Exception as e:  # no dynamo on this Python/torch, or fn is not compilable
            logger.warning("torch.compile is unavailable for %r (%s: %s); running it eagerly", fn, type(e).__name__, e)
            self.compiled = None

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            return self.eager(*args, **kwargs)
        if self.checked:
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as e:
            logger.warning("torch.compile of %r failed on its first call (%s: %s); running it eagerly",
                           self.eager, type(e).__name__, e)
            self.compiled = None
            return self.eager(*args, **kwargs)
        self.checked = True
        return out


def _kind(component: Any, position: int) -> str:
    if isinstance(component, nn.Module):
        return "trainable" if any(p.requires_grad for p in component.parameters()) else "frozen"
    if isinstance(component, Optimizer):
        return "optimizer"
    if isinstance(component, LRScheduler):
        return "lr_scheduler"
    if isinstance(component, Dataset):
        return "dataset"
    if callable(component):
        return "function"
    raise TypeError(
        f"initialize: argument {position} is a {type(component).__name__}; expected an nn.Module, an "
        f"optimizer, an LR scheduler, a torch Dataset or a callable"
    )


def classify_components(components) -> List[str]:
    """The kind of each component, checking there is exactly one trainable module and at most one
    optimizer and LR scheduler (which need the module)."""
    kinds = [_kind(c, i) for i, c in enumerate(components)]
    trainable = [i for i, k in enumerate(kinds) if k == "trainable"]
    if len(trainable) != 1:
        found = f"arguments {trainable} are" if trainable else "none is"
        raise ValueError(
            f"initialize takes exactly one trainable module (one with a parameter that requires grad), but "
            f"{found}; call .requires_grad_(False) on frozen modules (encoders, VAE) before passing them"
        )
    for kind in ("optimizer", "lr_scheduler"):
        if kinds.count(kind) > 1:
            raise ValueError(f"initialize takes at most one {kind.replace('_', ' ')}, got {kinds.count(kind)}")
    return kinds


# --------------------------------------------------------------------------------------------------
# The facade
# --------------------------------------------------------------------------------------------------

class LiteGen:
    """LiteGen's interface on OpenDiTPlugin (see the module docstring).

    Args:
        config: any mapping or attribute object (dict, EasyDict, namespace, dataclass), or a
            ``TrainConfig``; read once into a ``TrainConfig`` (``gen.config``).
        strict: an unknown config key is a ConfigError (default); False: a stderr warning lists the
            keys LiteGen ignores (a config that also holds the user's own settings).
    """

    def __init__(self, config: Any, strict: bool = True) -> None:
        ignored: List[str] = []
        self.config = from_object(config, strict=strict, ignored=ignored)
        self.info = init_distributed()  # torchrun's environment, or a world of one
        self.device = self.info.device
        if ignored and self.info.is_main:
            print(f"warning: LiteGen ignores config keys it does not use: {', '.join(ignored)}", file=sys.stderr)
        self.exp_name = self.config.exp_name
        self.plugin, self.booster = build_booster(self.config, self.info)
        self.ema_enabled = self.config.ema.enable
        self.model = self.optimizer = self.lr_scheduler = None
        self.resume_state: Dict[str, Any] = {}
        self._ema_updates = 0  # update_ema calls (plus a resumed run's step): what the EMA's warm-up counts
        self.parallelize_report: Optional[ParallelizeReport] = None  # what initialize did to the trainable model
        self._encoder_group = None

    @property
    def checkpoint_folder(self) -> str:
        """Where ``save_*`` write and ``auto_resume`` looks: ``checkpoint_dir``, by default
        ``<results_dir>/<exp_name>/checkpoints`` (the same folder train.py and sample.py use)."""
        return checkpoint_root(self.config)

    # ------------------------------------------------------------------ initialize

    def initialize(self, *components):
        """Prepare each component by kind and return them in the given order (one component: itself)."""
        if self.model is not None:
            raise RuntimeError("initialize was already called; call it once with every component")
        kinds = classify_components(components)
        pick = {kind: components[kinds.index(kind)] for kind in ("trainable", "optimizer", "lr_scheduler")
                if kind in kinds}
        model = pick["trainable"]
        optimizer = pick.get("optimizer")
        if optimizer is not None:
            own = {id(p) for p in model.parameters()}
            if any(id(p) not in own for group in optimizer.param_groups for p in group["params"]):
                raise ValueError("the optimizer updates parameters that are not the trainable module's")

        self._prepare_trainable(model)
        if optimizer is not None and self.config.lora.rank:
            adapt_optimizer_to_lora(optimizer, model)
        self.model, self.optimizer, _, _, self.lr_scheduler = self.booster.boost(
            model, optimizer, lr_scheduler=pick.get("lr_scheduler"))
        self._load_initial_state()

        boosted = {"trainable": self.model, "optimizer": self.optimizer, "lr_scheduler": self.lr_scheduler}
        out = []
        for component, kind in zip(components, kinds):
            if kind in boosted:
                out.append(boosted[kind])
            elif kind == "frozen":
                out.append(self._prepare_frozen(component))
            elif kind == "dataset":
                out.append(self._dataloader(component))
            else:
                out.append(CompiledFunction(component))
        return out[0] if len(out) == 1 else tuple(out)

    def _prepare_trainable(self, model: nn.Module) -> None:
        """``parallelize_from_config``, as the trainers call it; its report is printed on rank 0."""
        self.parallelize_report = parallelize_from_config(model, self.config, self.plugin.sp_group)
        if self.info.is_main:
            print(self.parallelize_report)

    def _prepare_frozen(self, module: nn.Module) -> nn.Module:
        if not self.config.encoder.fsdp or next(module.parameters(), None) is None:
            return module.to(self.device)
        if self._encoder_group is None:
            self._encoder_group = node_group(self.plugin.node_size) if self.config.encoder.group else dist.group.WORLD
        return apply_frozen_fsdp(module, self._encoder_group, self.device)

    def _dataloader(self, dataset: Dataset):
        cfg = self.config
        validate_world(cfg, dist.get_world_size())  # global_batch_size splits over dp_size x grad_accum_steps
        return self.plugin.prepare_dataloader(
            dataset, batch_size=micro_batch_size(cfg, self.plugin.dp_size), shuffle=True,
            seed=cfg.global_seed, drop_last=True, num_workers=cfg.num_workers, pin_memory=cfg.pin_memory,
        )

    # ------------------------------------------------------------------ loading

    def _load_initial_state(self) -> None:
        cfg = self.config
        needs = ("optimizer",) * (self.optimizer is not None) + ("ema",) * self.ema_enabled
        resume = pick_resume_checkpoint(cfg, needs=needs)
        if cfg.auto_resume and not cfg.resume_from and resume is None and self.info.is_main:
            print(f"auto_resume: no complete checkpoint of {self.exp_name!r} in {self.checkpoint_folder} yet; "
                  f"starting {'from init_from' if cfg.init_from else 'fresh'}")
        if resume is None and cfg.init_from:
            load_model_weights(self.booster, self.model, cfg.init_from)
        # The one EMA, from the weights as they are now; a resume then loads (or restarts) it.
        ema = self.plugin.create_ema(self.model, self.optimizer) if self.ema_enabled else None
        self.resume_state = restore_run(
            self.booster, self.model, self.optimizer, self.lr_scheduler, ema=ema, resume=resume,
            auto=not cfg.resume_from, ema_resume_from=cfg.ema.resume_from)
        self._ema_updates = self.resume_state.get("step", 0)  # the warm-up continues where the run was saved
        if self.ema_enabled and cfg.lora.rank:  # adapters start at zero: a long horizon would erase them
            note = ema_horizon_note(cfg.ema.decay, cfg.max_steps, ema_warmup_on(cfg.ema.warmup, cfg.lora.rank))
            if note.startswith("warning:") and self.info.is_main:
                print(note, file=sys.stderr)

    # ------------------------------------------------------------------ training-time API

    def _require(self, what: str, ema: bool = False, optimizer: bool = False) -> None:
        if self.model is None:
            raise RuntimeError(f"{what} needs gen.initialize(...) first")
        if ema and not self.ema_enabled:
            raise RuntimeError(f"{what}: the EMA is off; set ema.enable to true in the config")
        if optimizer and self.optimizer is None:
            raise RuntimeError(f"{what}: initialize was given no optimizer")

    def update_ema(self, model, decay: Optional[float] = None) -> None:
        """``ema = decay * ema + (1 - decay) * weights`` on this rank's EMA shard (after optimizer.step());
        ``decay`` defaults to the config's ``ema.decay``, warmed up where ``ema.warmup`` resolves on (LoRA
        runs by default: ``opendit_lite.ema.decay``) over the updates made so far (a resumed run counts
        from its checkpoint's ``step``)."""
        self._require("update_ema", ema=True)
        next_decay = None
        if decay is None:
            ema, warmup = self.config.ema, ema_warmup_on(self.config.ema.warmup, self.config.lora.rank)
            decay, next_decay = (ema_decay(ema.decay, self._ema_updates + i, warmup) for i in (0, 1))
        self.plugin.update_ema(model, self.optimizer, decay=decay, next_decay=next_decay)
        self._ema_updates += 1

    def _target(self, kind: str, output_folder: Optional[str], filename: Optional[str], step: Optional[int]) -> str:
        return litegen_path(kind, output_folder or self.checkpoint_folder, self.exp_name, filename, step)

    def save_model(self, output_folder: Optional[str] = None, filename: Optional[str] = None,
                   step: Optional[int] = None) -> str:
        """Collective: write the full model state dict (one torch file) atomically; returns its path."""
        self._require("save_model")
        path = self._target("model", output_folder, filename, step)
        with atomic_path(path) as tmp:
            self.booster.save_model(self.model, tmp, shard=False)
        return path

    def save_optimizer(self, output_folder: Optional[str] = None, filename: Optional[str] = None,
                       step: Optional[int] = None) -> str:
        """Collective: write the optimizer state atomically (a file under DDP, a folder of shards under
        ZeRO); returns its path."""
        self._require("save_optimizer", optimizer=True)
        path = self._target("optimizer", output_folder, filename, step)
        with atomic_path(path) as tmp:
            self.booster.save_optimizer(self.optimizer, tmp, shard=self.plugin.zero_degree > 0)
        return path

    def save_ema(self, output_folder: Optional[str] = None, filename: Optional[str] = None,
                 step: Optional[int] = None) -> str:
        """Collective: gather the EMA and write it (fp32 torch state dict, rank 0) atomically; returns its path."""
        self._require("save_ema", ema=True)
        path = self._target("ema", output_folder, filename, step)
        with atomic_path(path) as tmp:
            state = self.plugin.ema.state_dict(only_rank_0=True)
            if dist.get_rank() == 0:
                torch.save(state, tmp)
        return path

    def save_checkpoint(self, step: int, extra_state: Optional[Dict[str, Any]] = None,
                        output_folder: Optional[str] = None, keep_last: Optional[int] = None) -> str:
        """Collective: everything needed to continue (model, optimizer, EMA, LR scheduler, RNG, the resolved
        config and ``extra_state``) as ``[exp_name]_step[N]/``, the folder train.py writes and sample.py
        reads; see ``opendit_lite.checkpoint.save_restore``."""
        self._require("save_checkpoint")
        keep_last = self.config.keep_last if keep_last is None else keep_last
        return save_checkpoint(
            self.booster, output_folder or self.checkpoint_folder, step, self.model, self.optimizer,
            self.lr_scheduler, ema=self.plugin.ema if self.ema_enabled else None,
            extra_state=dict(extra_state or {}, config=to_dict(self.config)), keep_last=keep_last or None,
            exp_name=self.exp_name,
        )
