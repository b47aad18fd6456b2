"""Config -> Wan 2.2 A14B's experts (``models/experts.py``): which components of ``model.pipeline`` a
run trains (``model.expert``), the folder each is loaded from, the noise range one expert alone
trains on, and the model: the one transformer, or both as ``NoiseExperts``.

A pipeline holds two experts when its ``model_index.json`` lists ``transformer_2`` and sets
``boundary_ratio``; the boundary timestep is ``boundary_ratio x num_train_timesteps`` of its
scheduler, as ``WanPipeline.__call__`` computes it. ``resolve_expert`` fills ``model.expert`` ("both"
when null) before anything is built, so the saved config says what was trained and the export
and sampling rebuild the same model.
"""

import json
import os
from typing import Callable, Optional, Tuple

import torch.nn as nn

from ..errors import ConfigError
from ..interop.pipeline_links import read_model_index
from ..models.experts import NoiseExperts, expert_components, expert_time_range


def pipeline_boundary(pipeline: Optional[str]) -> Optional[Tuple[float, int]]:
    """(boundary_ratio, the scheduler's num_train_timesteps) of a pipeline folder with two experts;
    None for no pipeline or a one-transformer pipeline."""
    if not pipeline:
        return None
    index = read_model_index(pipeline)
    second = index.get("transformer_2")
    ratio = index.get("boundary_ratio")
    if not (isinstance(second, list) and second[0] is not None and ratio is not None):
        return None
    scheduler = os.path.join(pipeline, "scheduler", "scheduler_config.json")
    steps = 1000
    if os.path.isfile(scheduler):
        with open(scheduler) as f:
            steps = int(json.load(f).get("num_train_timesteps", steps))
    return float(ratio), steps


def resolve_expert(cfg) -> None:
    """Check ``model.expert`` against the pipeline and fill it: "both" when null and the pipeline holds two
    experts; a setting without two experts, or two experts beside ``model.path`` / ``model.config``
    (which name one transformer), is a ConfigError."""
    m = cfg.model
    boundary = pipeline_boundary(m.pipeline)
    if boundary is None:
        if m.expert is not None:
            raise ConfigError(f"model.expert={m.expert} chooses between the two experts of a pipeline with "
                              f"transformer_2 and boundary_ratio (Wan 2.2 A14B), but "
                              f"{'model.pipeline is not set' if not m.pipeline else repr(m.pipeline) + ' has one'}: "
                              f"remove model.expert.")
        return
    if m.path or m.config:
        raise ConfigError(f"model.pipeline {m.pipeline!r} holds two experts (transformer and transformer_2), which the "
                          f"run loads from it; model.path / model.config name a single transformer: remove them.")
    m.expert = m.expert or "both"


def trained_components(cfg) -> Tuple[str, ...]:
    """The pipeline components the run trains (after ``resolve_expert``): ``transformer`` for a
    one-transformer model."""
    return expert_components(cfg.model.expert)


def component_path(cfg) -> Optional[str]:
    """The folder of the (first) trained transformer when it comes from ``model.pipeline`` with two
    experts; None otherwise (``model.path`` or ``model.config`` give it)."""
    if cfg.model.expert is None:
        return None
    return os.path.join(cfg.model.pipeline, trained_components(cfg)[0])


def expert_objective_range(cfg) -> Tuple[float, float]:
    """The flow times the run trains on: one expert alone, its own noise range; otherwise all."""
    if cfg.model.expert is None:
        return 0.0, 1.0
    ratio, _ = pipeline_boundary(cfg.model.pipeline)
    return expert_time_range(cfg.model.expert, ratio)


def build_experts(cfg, load: Callable[[str], nn.Module]) -> Optional[nn.Module]:
    """``model.expert: both``: ``NoiseExperts`` of the pipeline's two transformers, each loaded by
    ``load(folder)``; None for any other run (one transformer, built the usual way)."""
    if cfg.model.expert != "both":
        return None
    ratio, steps = pipeline_boundary(cfg.model.pipeline)
    return NoiseExperts(load(os.path.join(cfg.model.pipeline, "transformer")),
                        load(os.path.join(cfg.model.pipeline, "transformer_2")), boundary=ratio * steps)
