"""One training run for any ``TrainerSpec`` (train.py: images, train_video.py: clips).

The run, in order: plugin and mesh (the precision resolved once); the same model initialisation on
every rank; data, model and weights from the spec; ``parallelize_from_config`` (kernels -> sequence
parallelism -> activation checkpointing -> compile); the ``TrainState`` (boosted optimizer,
schedule and loader, the EMA); per-data-parallel-rank seeds; resume into the state; then the step
loop of ``loop.py`` with "batch -> loss" built from the spec's ``model_inputs`` and the diffusion
objective.
"""

import contextlib
import os
import sys

import torch

from ..builders.lora_checkpoint import export_merged
from ..builders.objective import build_training_objective
from ..builders.parallelize import parallelize_from_config
from ..checkpoint.layout import checkpoint_root, wants_resume
from ..checkpoint.litter import remove_orphaned_tmp
from ..checkpoint.weights import load_weights
from ..config import ConfigError, to_dict, validate_world
from ..data.indexed import IndexedDataset
from ..diffusion.loss import objective_loss
from ..diffusion.sampling_utils import SampleGenerators
from ..distributed.process_group import cleanup_distributed, init_distributed
from ..distributed.seed import seed_everything
from ..ema import ema_horizon_note, ema_warmup_on
from ..families import is_family
from ..interop.lora_import import load_lora_file
from ..models import MODELS, registered_class
from ..models.capabilities import check_sp_mode, condition_dropout_kwarg
from ..utils.exit_codes import ignore_stop_signals
from .loop import build_booster, run_steps, write_run_config
from .preflight import check_disk_space, check_training_inputs, check_writable
from .run_lock import RunLock, experiment_lock_name
from .spec import TrainerSpec
from .state import build_train_state, restore_train_state
from .telemetry import MetricsLogger


def train(spec: TrainerSpec, cfg, info) -> str:
    """Train ``cfg.max_steps`` steps of the spec's model; returns the final checkpoint's path."""
    run_dir = os.path.join(cfg.results_dir, cfg.exp_name)
    log = MetricsLogger(run_dir, enabled=info.is_main, loggers=cfg.logger, run_name=cfg.exp_name,
                        config=to_dict(cfg))
    # after each checkpoint: eval_every's evaluation, sample.every's samples (checked before anything is built)
    hooks = [evaluation_hook(spec, cfg, log), spec.sampler(cfg, log) if spec.sampler is not None else None]
    after_save = chain_hooks([hook for hook in hooks if hook is not None])

    # First: it builds the mesh sequence parallelism needs. Distillation trains one of two networks per
    # step, so DDP must not wait for the other's gradients.
    plugin, booster = build_booster(cfg, info, find_unused_parameters=distilling(cfg))
    seed_everything(cfg.global_seed, 0, 1)  # the same model initialisation on every rank

    data = spec.prepare_data(cfg, info.device, plugin.sp_group)
    model = spec.build_model(cfg)
    if cfg.init_from and not wants_resume(cfg):
        load_weights(model, cfg.init_from, use_ema=False)
        log.write(f"initialised weights from {cfg.init_from}")
    # Every transformation of the serial model (LoRA adapters first), in parallelize's order, before
    # the plugin wraps it.
    log.write(str(parallelize_from_config(model, cfg, plugin.sp_group)))
    if cfg.lora.init_from and not wants_resume(cfg):  # the adapters exist now: start them from the file
        log.write(load_lora_file(model, cfg.lora.init_from))
    objective = spec.objective(cfg) if spec.objective is not None else build_training_objective(cfg)
    model.to(info.device)
    num_params = sum(p.numel() for p in model.parameters())
    check_disk_space(checkpoint_root(cfg), num_params)
    log.write(f"model {cfg.model.name}: {num_params / 1e6:.2f}M parameters, {spec.describe(cfg)}, "
              f"{cfg.diffusion.objective}, precision {plugin.precision.name}")
    if cfg.lora.rank and cfg.ema.enable:  # adapters start at zero: say what the EMA keeps of them
        note = ema_horizon_note(cfg.ema.decay, cfg.max_steps, ema_warmup_on(cfg.ema.warmup, cfg.lora.rank))
        (_say if note.startswith("warning:") and info.is_main else log.write)(note)

    batch_sampler = None
    if data.batch_sampler is not None:  # e.g. buckets of clip shapes
        batch_sampler = data.batch_sampler(model, plugin.dp_rank, plugin.dp_size, info.world_size, log,
                                           precision=plugin.precision)
    # Batches are [dataset indices, loader batch]: a sample's draws are keyed by its index (see batch_loss).
    state = build_train_state(cfg, plugin, booster, model, IndexedDataset(data.dataset), batch_sampler,
                              collate=data.collate)
    # Anything else random (data augmentation) draws from one stream per data-parallel rank, which
    # the ranks of a sequence-parallel group share.
    seed_everything(cfg.global_seed, plugin.dp_rank, plugin.dp_size)
    resumed = restore_train_state(state, cfg, booster, log)
    write_run_config(cfg, run_dir, info.is_main)
    if resumed and state.step >= cfg.max_steps:  # e.g. `make demo` run twice: the run is complete
        log.write(f"nothing left to train: {resumed} is at step {state.step} and max_steps={cfg.max_steps} (raise "
                  f"max_steps to continue, or start over with overwrite=true auto_resume=false)")
        log.close()
        return resumed
    # What the objective calls: the boosted model, or (a diffusers family) it through its adapter;
    # the capabilities are declared by the serial model's class or by that denoiser.
    if data.denoiser is not None:
        denoiser = data.denoiser(model, state.model)
    else:
        denoiser = spec.denoiser(cfg, model, state.model) if spec.denoiser is not None else state.model
    declared = model if denoiser is state.model else denoiser
    drop_kwarg = condition_dropout_kwarg(declared) if cfg.model.class_dropout_prob > 0 else None

    def batch_loss(indexed_batch, step: int) -> torch.Tensor:
        # Each sample's noise, time and condition dropout come from its own stream, seeded by
        # (global_seed, dataset index, step): the run is the same on 1 process or many ranks, and
        # the ranks of a sequence-parallel group (same samples) draw alike.
        indices, batch = indexed_batch                                    # indices [B]
        draws = SampleGenerators(cfg.global_seed, indices.tolist(), stream=(step,))
        x, model_kwargs = data.model_inputs(batch)
        if drop_kwarg is not None:
            u = draws.uniform((len(draws),), x.device, torch.float32)      # [B]
            model_kwargs[drop_kwarg] = u < cfg.model.class_dropout_prob
        batch_objective = objective if data.objective is None else data.objective(tuple(x.shape))
        if spec.loss is not None:
            loss = spec.loss(denoiser, batch_objective, cfg, x, model_kwargs, draws, step)
        else:
            loss = objective_loss(batch_objective, denoiser, x, model_kwargs, draws)
        return loss * data.loss_weight(batch) if data.loss_weight is not None else loss

    path = run_steps(state, cfg, booster, log, batch_loss, device=info.device, after_save=after_save)
    if spec.finish is not None:
        spec.finish(cfg, path, run_dir)
    merge = cfg.lora.export_merged if cfg.lora.export_merged is not None else not is_family(cfg.model.name)
    if cfg.lora.rank and merge and info.is_main and not distilling(cfg):  # a student is exported by spec.finish
        merged = export_merged(spec.build_model(cfg), path, os.path.join(run_dir, "merged.safetensors"),
                               use_ema=cfg.ema.enable, lora=to_dict(cfg.lora))
        print(f"wrote the merged LoRA weights to {merged} (sample.ckpt={merged} or init_from={merged})")
    return path


def distilling(cfg) -> bool:
    """Whether ``cfg`` is a distillation run (``distill.teacher`` set)."""
    distill = getattr(cfg, "distill", None)
    return bool(distill is not None and distill.teacher)


def chain_hooks(hooks):
    """One ``after_save(step, checkpoint)`` running ``hooks`` in order (None when there are none)."""
    if not hooks:
        return None

    def after_save(step: int, checkpoint: str) -> None:
        for hook in hooks:
            hook(step, checkpoint)

    return after_save


def evaluation_hook(spec: TrainerSpec, cfg, log):
    """The spec's ``eval_every`` hook (None when eval_every=0)."""
    if not cfg.eval_every:
        return None
    if spec.evaluator is None:
        raise ConfigError(f"'eval_every' is not available for the {spec.name} trainer (its evaluation, FID, is for "
                          f"class-conditional image models): set eval_every=0.")
    return spec.evaluator(cfg, log)


def train_from_config(spec: TrainerSpec, cfg) -> str:
    """What train.py and train_video.py run once their config is parsed (before they import this
    module, so that a config error ends before torch is imported; their ``script_main`` turns the
    errors into exit codes): check the settings across sections before any process group starts,
    train, and tear the process group down; returns the final checkpoint's path."""
    if distilling(cfg) and not spec.distills:
        raise ConfigError(f"'distill.teacher' is set, but the {spec.name} trainer does not distill {cfg.model.name} "
                          f"yet (train.py distills the zoo's image models, train_video.py and train.py a "
                          f"model.pipeline run; the video zoo's models are not supported yet): remove "
                          f"distill.teacher.")
    if spec.validate is not None:
        spec.validate(cfg)
    if cfg.sp_size > 1 and cfg.model.name in MODELS and registered_class(cfg.model.name) is not None:
        check_sp_mode(registered_class(cfg.model.name), cfg.sp_mode)
    info = init_distributed()
    try:
        validate_world(cfg, info.world_size)
        check_writable(cfg.results_dir, "results_dir")  # the run folder's lock goes there
        # One run per run folder: the checks of what the folder holds, and everything after, happen
        # under its lock (rank 0 takes it; a second run on the folder stops here naming the first).
        with RunLock(os.path.join(cfg.results_dir, cfg.exp_name), info.is_main, report=_say), \
                _checkpoint_dir_lock(cfg, info.is_main):
            check_training_inputs(cfg, family=spec.name)
            if info.is_main:
                removed = remove_orphaned_tmp(checkpoint_root(cfg), cfg.exp_name)
                if removed:
                    _say(f"removed {len(removed)} temporary folder(s) left by interrupted saves of this run: "
                         f"{', '.join(removed)}")
            return train(spec, cfg, info)
    except BaseException:
        if info.world_size > 1:  # on its way to an exit code: torchrun stopping the other ranks must not change it
            ignore_stop_signals()
        raise
    finally:
        cleanup_distributed()


def _checkpoint_dir_lock(cfg, is_main: bool):
    """The experiment's lock in a ``checkpoint_dir`` of its own (other runs may share that folder)."""
    if not cfg.checkpoint_dir:
        return contextlib.nullcontext()
    check_writable(cfg.checkpoint_dir, "checkpoint_dir")
    return RunLock(cfg.checkpoint_dir, is_main, report=_say, name=experiment_lock_name(cfg.exp_name))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
