"""LiteGen-compatible facade: one object built from a config, one ``initialize`` call.

    gen = LiteGen(config)
    model, optimizer, text_encoder, dataloader, vae_encode = gen.initialize(
        model, optimizer, text_encoder, dataset, vae.encode)
    for step, batch in ...:
        ...
        gen.update_ema(model, decay=0.9999)
        if step % every == 0:
            gen.save_model(step=step); gen.save_optimizer(step=step); gen.save_ema(step=step)
            # or everything at once (LR scheduler, RNG, epoch/sampler position, config):
            gen.save_checkpoint(step, extra_state={"epoch": epoch})

Everything runs through :class:`~opendit_lite.plugins.OpenDiTPlugin` and a Colossal-AI
``Booster``; this module only reads the config, orders the steps and names the files.

``initialize(*components)`` returns the components in the order given, each prepared by kind:

- the one trainable ``nn.Module`` (any parameter with ``requires_grad``; zero or several are an
  error): ``opendit_lite.parallelize`` with the config's settings (fused kernels, attention
  backend, Ulysses/DSP sequence parallelism when ``sp_size > 1``, activation checkpointing/offload
  from ``selective_ratio``/``ac_offload``, per-block ``compile``, in that order; see
  ``parallelize.py`` for why), then boosted with its optimizer and LR scheduler. Then the weights are loaded (see below) and the
  EMA is created from them (``ema.enable``), so it starts from the loaded weights;
- its ``torch.optim.Optimizer`` and optional ``LRScheduler``: boosted with it;
- frozen modules (no trainable parameter): moved to this rank's device; with ``encoder.fsdp``
  sharded by torch FSDP (FULL_SHARD, for inference) over the world or, with ``encoder.group``,
  within each node;
- a ``Dataset``: a DataLoader sharded over the data-parallel ranks, ``global_batch_size //
  (dp_size * grad_accum_steps)`` samples per rank and micro-batch;
- any other callable (e.g. ``vae.encode``): wrapped by ``torch.compile``, falling back to the eager
  callable when compilation is unavailable or fails on the first call. A method stays bound to
  its original module: pass ``vae.encode`` or ``vae``, not both with ``encoder.fsdp`` (the FSDP
  wrapper would own the module's parameters, the bound method would not see them).

Loading, in increasing priority (as LiteGen): ``init_from`` (weights only, a fresh start);
``resume_from`` (weights and optimizer state, from a model file saved by ``save_model`` with its
``.optim_state.pth`` next to it, or a ``save_checkpoint`` folder, which also restores the LR
scheduler, RNG and extra state; the EMA from ``ema.resume_from`` when given, else from such a
folder); ``auto_resume`` (only when ``resume_from`` is empty: the newest complete checkpoint of
``exp_name`` in the results folder, of either kind; falls back to ``init_from`` when there is
none). ``gen.resume_state`` holds what a resume restored (``step`` and the saved extra state).

File names (LiteGen's): in ``output_folder`` (default: ``results_dir``, also spelled
``result_dir`` or ``checkpoint_dir``; ``outputs`` when none is set), ``filename`` when given, else ``[exp_name].pth``,
``[exp_name].optim_state.pth`` and ``[exp_name].ema.pth``, with ``[exp_name]_step[N]`` as the
prefix when ``step`` is given. The model and EMA files are single torch state dicts (the EMA in
fp32); the optimizer file is a single file under DDP and a *folder* of shards under ZeRO (one rank
never holds the whole optimizer state). Every one is written under a temporary name and renamed
when complete, so a crash never leaves a truncated file under the final name.

Config fields are read by attribute (a dataclass, an EasyDict) or key (a dict); a missing field
takes the default of :class:`opendit_lite.config.TrainConfig`. Fields used: ``exp_name``,
``results_dir``/``result_dir``/``checkpoint_dir``, ``init_from``, ``resume_from``,
``auto_resume``, ``precision`` (fp32/tf32/bf16/fp16), ``allow_tf32``, ``zero_degree``,
``group_zero``, ``sp_size``, ``grad_clip``, ``selective_ratio``, ``ac_offload``, the module
conversion keys (``fused_layernorm``, ...), ``ema.enable``/``ema.resume_from``,
``encoder.fsdp``/``encoder.group``, ``global_seed``, ``global_batch_size``, ``grad_accum_steps``,
``num_workers``, ``pin_memory``, ``keep_last``. The EMA is always sharded (``ema.sharded`` is
accepted and has no effect): saving gathers it anyway.
"""

import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping
from functools import partial
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from colossalai.booster import Booster
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import Dataset

from .config.access import config_get
from .config.schema import TrainConfig
from .parallelize import parallelize
from .plugins import OpenDiTPlugin
from .checkpoint.state import (
    EMA_FILE,
    CheckpointError,
    atomic_path,
    checkpoint_name,
    is_checkpoint_dir,
    list_checkpoints,
    load_checkpoint,
    load_ema_file,
    load_model_weights,
    load_optimizer_state,
    save_checkpoint,
)
from .distributed.mesh import block_groups
from .plugins.opendit_plugin import default_node_size
from .distributed.launch import init_distributed

logger = logging.getLogger(__name__)

SUFFIXES = {"model": ".pth", "optimizer": ".optim_state.pth", "ema": ".ema.pth"}
# FSDP unit size for frozen encoders: blocks of at least this many parameters are gathered one at
# a time (T5-XXL's ~200M-parameter blocks), smaller models (CLIP text towers) as one unit.
FSDP_MIN_UNIT_PARAMS = 100_000_000
_DEFAULTS = TrainConfig()


# --------------------------------------------------------------------------------------------------
# Config access and file names
# --------------------------------------------------------------------------------------------------

def results_folder(config: Any) -> str:
    """LiteGen's results folder: ``results_dir``, ``result_dir`` or ``checkpoint_dir``, the first
    set; TrainConfig's ``results_dir`` default when none is."""
    for key in ("results_dir", "result_dir", "checkpoint_dir"):
        value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
        if value:
            return value
    return _DEFAULTS.results_dir


def litegen_path(kind: str, folder: str, exp_name: str, filename: Optional[str] = None,
                 step: Optional[int] = None) -> str:
    """Where ``save_<kind>`` writes: ``folder/filename``, else ``folder/[exp_name](_step[N])<suffix>``
    with the suffix ``.pth`` (model), ``.optim_state.pth`` (optimizer) or ``.ema.pth`` (EMA)."""
    if filename is None:
        prefix = exp_name if step is None else checkpoint_name(exp_name, step)
        filename = prefix + SUFFIXES[kind]
    return os.path.join(folder, filename)


def companion_path(model_path: str, kind: str) -> str:
    """The ``kind`` file saved next to a LiteGen model file: ``X.pth`` -> ``X.optim_state.pth`` / ``X.ema.pth``."""
    model_path = model_path.rstrip("/")
    base = model_path[: -len(".pth")] if model_path.endswith(".pth") else model_path
    return base + SUFFIXES[kind]


def _step_of(path: str) -> Optional[int]:
    match = re.search(r"_step(\d+)(\.pth)?$", path.rstrip("/"))
    return int(match.group(1)) if match else None


def _config_dict(config: Any) -> Dict[str, Any]:
    """The config as JSON-compatible data for meta.json; values JSON cannot hold become strings."""
    if dataclasses.is_dataclass(config):
        data = dataclasses.asdict(config)
    elif isinstance(config, Mapping):
        data = dict(config)
    else:
        data = {k: v for k, v in vars(config).items() if not k.startswith("_")}
    return json.loads(json.dumps(data, default=str))


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
    """LiteGen's interface on OpenDiTPlugin (see the module docstring). Initialises
    ``torch.distributed`` when needed (``torchrun`` environment, or a world of one)."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.exp_name = config_get(config, "exp_name")
        self.device = init_distributed().device
        precision = config_get(config, "precision")
        allow_tf32 = precision == "tf32" or bool(config_get(config, "allow_tf32"))
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allow_tf32
        self.plugin = OpenDiTPlugin(
            zero_degree=config_get(config, "zero_degree"),
            sp_size=config_get(config, "sp_size"),
            precision="fp32" if precision == "tf32" else precision,
            grad_clip=config_get(config, "grad_clip"),
            group_zero=bool(config_get(config, "group_zero")),
        )
        self.booster = Booster(plugin=self.plugin)
        self.ema_enabled = bool(config_get(config, "ema.enable"))
        self.model = self.optimizer = self.lr_scheduler = None
        self.resume_state: Dict[str, Any] = {}
        self._encoder_group = None

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

        c = self.config
        logger.info("%s", parallelize(
            model, sp_group=self.plugin.sp_group, sp_mode=config_get(c, "sp_mode"),
            fused_adaln=bool(config_get(c, "fused_adaln")), fused_layernorm=bool(config_get(c, "fused_layernorm")),
            attention_backend=config_get(c, "attention_backend"), selective_ratio=config_get(c, "selective_ratio"),
            ac_offload=bool(config_get(c, "ac_offload")), compile=bool(config_get(c, "compile"))))
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

    def _prepare_frozen(self, module: nn.Module) -> nn.Module:
        if not config_get(self.config, "encoder.fsdp") or next(module.parameters(), None) is None:
            return module.to(self.device)
        if self._encoder_group is None:
            if config_get(self.config, "encoder.group"):
                node_size = self.plugin.node_size or default_node_size(dist.get_world_size())
                self._encoder_group = block_groups(node_size)[0]
            else:
                self._encoder_group = dist.group.WORLD
        return apply_frozen_fsdp(module, self._encoder_group, self.device)

    def _dataloader(self, dataset: Dataset):
        global_batch = config_get(self.config, "global_batch_size")
        accum = config_get(self.config, "grad_accum_steps")
        dp = self.plugin.dp_size
        if global_batch % (dp * accum):
            raise ValueError(
                f"global_batch_size={global_batch} must be a multiple of dp_size * grad_accum_steps = "
                f"{dp} * {accum}; change global_batch_size, grad_accum_steps or the number of ranks"
            )
        return self.plugin.prepare_dataloader(
            dataset, batch_size=global_batch // (dp * accum), shuffle=True, seed=config_get(self.config, "global_seed"),
            drop_last=True, num_workers=config_get(self.config, "num_workers"),
            pin_memory=bool(config_get(self.config, "pin_memory")),
        )

    # ------------------------------------------------------------------ loading

    def find_auto_resume(self) -> Optional[str]:
        """The newest complete checkpoint of ``exp_name`` in the results folder, or None.

        Candidates: ``save_checkpoint`` folders with their completion marker, and ``save_model``
        files ``[exp_name]_step[N].pth`` whose optimizer file (when there is an optimizer) and EMA
        file (when the EMA is on) exist too. At equal steps the folder wins (it holds more state).
        """
        folder = results_folder(self.config)
        if not os.path.isdir(folder):
            return None
        candidates = [(step, 1, path) for step, path in list_checkpoints(folder, self.exp_name)]
        pattern = re.compile(rf"{re.escape(self.exp_name)}_step(\d+)\.pth")
        for name in os.listdir(folder):
            match = pattern.fullmatch(name)
            path = os.path.join(folder, name)
            if match is None or not os.path.isfile(path):
                continue
            needed = ["optimizer"] * (self.optimizer is not None) + ["ema"] * self.ema_enabled
            if all(os.path.exists(companion_path(path, kind)) for kind in needed):
                candidates.append((int(match.group(1)), 0, path))
        return max(candidates)[2] if candidates else None

    def _load_initial_state(self) -> None:
        resume_from = config_get(self.config, "resume_from")
        ema_from = config_get(self.config, "ema.resume_from")
        auto = not resume_from and bool(config_get(self.config, "auto_resume"))
        if auto:
            resume_from, ema_from = self.find_auto_resume(), None  # the EMA comes with what is found
            if resume_from is None:
                logger.info("auto_resume: no complete checkpoint of %r yet; starting fresh", self.exp_name)
        if resume_from:
            logger.info("resuming from %s", resume_from)
            if is_checkpoint_dir(resume_from):
                self.resume_state = load_checkpoint(self.booster, resume_from, self.model, self.optimizer,
                                                    self.lr_scheduler)
                saved_ema = os.path.join(resume_from, EMA_FILE)
                ema_from = ema_from or (saved_ema if os.path.isfile(saved_ema) else None)
            else:
                self._resume_litegen_files(resume_from)
                if auto and self.ema_enabled:
                    ema_from = companion_path(resume_from, "ema")
        elif config_get(self.config, "init_from"):
            load_model_weights(self.booster, self.model, config_get(self.config, "init_from"))
        if self.ema_enabled:
            self.plugin.create_ema(self.model)  # equal to the weights just loaded
            if ema_from:
                load_ema_file(self.plugin, ema_from)
            elif resume_from:
                logger.warning("no EMA to resume (set ema.resume_from): the EMA restarts from the resumed weights")

    def _resume_litegen_files(self, model_path: str) -> None:
        load_model_weights(self.booster, self.model, model_path)
        if self.optimizer is not None:
            optim_path = companion_path(model_path, "optimizer")
            if not os.path.exists(optim_path):
                raise CheckpointError(
                    f"{optim_path} does not exist: resume_from={model_path} needs the optimizer state saved "
                    f"next to it by save_optimizer (use init_from to load the weights only)"
                )
            load_optimizer_state(self.booster, self.optimizer, optim_path)
        step = _step_of(model_path)
        self.resume_state = {} if step is None else {"step": step}
        if self.lr_scheduler is not None:
            logger.warning("%s holds no LR scheduler state; the scheduler restarts (gen.save_checkpoint keeps it)",
                           model_path)

    # ------------------------------------------------------------------ training-time API

    def _require(self, what: str, ema: bool = False, optimizer: bool = False) -> None:
        if self.model is None:
            raise RuntimeError(f"{what} needs gen.initialize(...) first")
        if ema and not self.ema_enabled:
            raise RuntimeError(f"{what}: the EMA is off; set ema.enable to true in the config")
        if optimizer and self.optimizer is None:
            raise RuntimeError(f"{what}: initialize was given no optimizer")

    def update_ema(self, model, decay: float = 0.9999) -> None:
        """``ema = decay * ema + (1 - decay) * weights`` on this rank's EMA shard (after optimizer.step())."""
        self._require("update_ema", ema=True)
        self.plugin.update_ema(model, self.optimizer, decay=decay)

    def _target(self, kind: str, output_folder: Optional[str], filename: Optional[str], step: Optional[int]) -> str:
        return litegen_path(kind, output_folder or results_folder(self.config), self.exp_name, filename, step)

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
            state = self.plugin.ema_state_dict(only_rank_0=True)
            if dist.get_rank() == 0:
                torch.save(state, tmp)
        return path

    def save_checkpoint(self, step: int, extra_state: Optional[Dict[str, Any]] = None,
                        output_folder: Optional[str] = None, keep_last: Optional[int] = None) -> str:
        """Collective: everything needed to continue (model, optimizer, EMA, LR scheduler, RNG, config and
        ``extra_state``) as ``[exp_name]_step[N]/``; see ``opendit_lite.checkpoint.state``."""
        self._require("save_checkpoint")
        return save_checkpoint(
            self.booster, output_folder or results_folder(self.config), step, self.model, self.optimizer, self.lr_scheduler,
            plugin=self.plugin if self.ema_enabled else None,
            extra_state=dict(extra_state or {}, config=_config_dict(self.config)),
            keep_last=config_get(self.config, "keep_last") if keep_last is None else keep_last,
            exp_name=self.exp_name,
        )
