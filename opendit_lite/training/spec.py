"""What a trainer declares: the only parts of a training run that differ between model families.

``opendit_lite.training.trainer`` runs the same loop for every ``TrainerSpec``; the image spec is
in ``training/image.py``, the video spec in ``training/video.py``.
"""

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass(frozen=True)
class TrainingData:
    """A dataset and how one of its loader batches becomes the model's input.

    ``batch_sampler(model, dp_rank, dp_size, world_size, log, precision=...)`` (the run's resolved
    ``opendit_lite.precision.Precision``, which ``bucket_batch: auto`` plans with), when given,
    replaces the distributed sampler with one that sets each batch's samples and size (the bucket sampler of
    ``data/buckets.py``: the trainer then streams with ``BucketBatches``); ``loss_weight(batch)``
    scales a batch's loss (a bucket's ``loss_weight``); ``objective(x_shape)``, when given, is the
    objective of a batch of clean inputs of that shape (a shift per bucket: the token-count shift of
    Flux and LTX-Video), else the config's; ``denoiser(model, wrapped)``, when given, is what the
    objective calls, in place of the spec's (a run from a pipeline folder, whose denoiser holds what the
    data encoded once: the pipeline's unconditional text); ``collate``, when given, batches the loader's
    ``(index, item)`` pairs in place of torch's default (items with a list of conditioning images of
    several sizes)."""

    dataset: Any
    # loader batch -> (x [B, ...] the clean input of the objective, extra model keyword arguments)
    model_inputs: Callable[[Any], Tuple[torch.Tensor, dict]]
    batch_sampler: Optional[Callable[..., Any]] = None
    loss_weight: Optional[Callable[[Any], float]] = None
    objective: Optional[Callable[[Tuple[int, ...]], Any]] = None
    denoiser: Optional[Callable[[nn.Module, nn.Module], Callable]] = None
    collate: Optional[Callable[[Any], Any]] = None


@dataclass(frozen=True)
class TrainerSpec:
    """A model family's trainer.

    ``prepare_data(cfg, device, sp_group)`` builds the dataset and encoders and fills the model
    geometry left unset in ``cfg`` from them (so the saved config rebuilds the model);
    ``build_model(cfg)`` builds the serial model; ``describe(cfg)`` is the input part of the log
    line ("input [32, 32] x 3 ch, 8 classes"); ``validate(cfg)`` checks settings across sections
    before any process group starts; ``denoiser(cfg, model, wrapped)`` gives what the objective
    calls (None: the wrapped model; a diffusers family's model through its adapter);
    ``evaluator(cfg, log)`` builds the hook run after each saved checkpoint for ``eval_every``
    (None: the family has no evaluation); ``finish(cfg, checkpoint, run_dir)`` runs on every rank
    after the last step with the final checkpoint (a diffusers family's export); ``objective(cfg)``
    builds the training objective (None: ``builders.objective.build_training_objective``; the video
    trainer's restricts the times of one trained expert to its noise range); ``sampler(cfg, log)``
    builds the hook run after each saved checkpoint for ``sample.every`` (None: the trainer has none);
    ``loss(denoiser, objective, cfg, x, model_kwargs, draws, step)``, when given, is a batch's loss in place
    of the objective's (distillation: which network a step trains depends on the step); ``loss_kinds(cfg)``,
    when given, is ``(kind_of_step, names)``: each step's loss is also logged under ``names[kind_of_step(step)]``
    (distillation's critic and student losses); ``distills``: the
    trainer takes ``distill.teacher`` (train.py's distillation of the zoo's image models).
    """

    name: str
    schema: type
    prepare_data: Callable[[Any, torch.device, Optional[dist.ProcessGroup]], TrainingData]
    build_model: Callable[[Any], nn.Module]
    describe: Callable[[Any], str]
    validate: Optional[Callable[[Any], None]] = None
    # (cfg, built model, the booster's wrapper of it) -> what the objective calls as model(x, t, **kwargs)
    denoiser: Optional[Callable[[Any, nn.Module, nn.Module], Callable]] = None
    evaluator: Optional[Callable[[Any, Any], Optional[Callable[[int, str], None]]]] = None
    finish: Optional[Callable[[Any, str, str], None]] = None
    objective: Optional[Callable[[Any], Any]] = None
    sampler: Optional[Callable[[Any, Any], Optional[Callable[[int, str], None]]]] = None
    loss: Optional[Callable[..., torch.Tensor]] = None
    loss_kinds: Optional[Callable[[Any], Tuple[Callable[[int], int], Tuple[str, ...]]]] = None
    distills: bool = False
