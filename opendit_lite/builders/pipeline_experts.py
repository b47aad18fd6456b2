"""Config -> Wan 2.2 A14B's experts (``models/experts.py``): which components of ``model.pipeline`` a
run trains (``model.expert``), the noise range one expert alone trains on, and the model: the one
transformer, or both as ``NoiseExperts``.

A pipeline folder holds two experts when its ``model_index.json`` lists ``transformer_2`` and its
family's conditioning reads a boundary from the pipeline (``expert_boundary``: WanPipeline's
``boundary_ratio x num_train_timesteps``, as its ``__call__`` computes it). ``resolve_expert`` fills
``model.expert`` ("both" when null) before anything is built, so the saved config says what was
trained and the export and sampling rebuild the same model.
"""

from typing import Callable, Optional, Tuple

import torch.nn as nn

from ..errors import ConfigError
from ..models.experts import NoiseExperts, expert_components, expert_time_range
from .pipeline import light_pipeline, pipeline_folder, run_pipeline_folder


def pipeline_boundary(pipeline: Optional[str]) -> Optional[float]:
    """The timestep at and above which the pipeline folder ``pipeline`` runs ``transformer`` (below it
    ``transformer_2``); None for no pipeline or one transformer."""
    if not pipeline:
        return None
    folder = pipeline_folder(pipeline)
    if "transformer_2" not in folder.experts:
        return None
    return folder.conditioning.expert_boundary(light_pipeline(pipeline, folder.pipeline_class))


def resolve_expert(cfg) -> None:
    """Check ``model.expert`` against the pipeline and fill it: "both" when null and the pipeline holds
    two experts; a setting without two experts is a ConfigError. (``model.path`` / ``model.config``
    beside a pipeline are refused by ``builders.pipeline.resolve_pipeline``.)"""
    m = cfg.model
    if pipeline_boundary(m.pipeline) is None:
        if m.expert is not None:
            raise ConfigError(f"model.expert={m.expert} chooses between the two experts of a pipeline with "
                              f"transformer_2 and boundary_ratio (Wan 2.2 A14B), but "
                              f"{'model.pipeline is not set' if not m.pipeline else repr(m.pipeline) + ' has one'}: "
                              f"remove model.expert.")
        return
    m.expert = m.expert or "both"


def trained_components(cfg) -> Tuple[str, ...]:
    """The pipeline components the run trains (after ``resolve_expert``): ``transformer`` for a
    one-transformer model."""
    return expert_components(getattr(cfg.model, "expert", None))


def expert_objective_range(cfg) -> Tuple[float, float]:
    """The flow times the run trains on: one expert alone, its own noise range; otherwise all. (The
    objective calls the model with ``time x diffusion_steps``, the timestep the boundary is in.)"""
    if getattr(cfg.model, "expert", None) in (None, "both"):
        return 0.0, 1.0
    return expert_time_range(cfg.model.expert, pipeline_boundary(cfg.model.pipeline) / cfg.diffusion.diffusion_steps)


def build_experts(cfg, load: Callable[[str], nn.Module]) -> Optional[nn.Module]:
    """``model.expert: both``: ``NoiseExperts`` of the pipeline's two transformers, each loaded by
    ``load(folder)``; None for any other run (one transformer, built the usual way)."""
    if getattr(cfg.model, "expert", None) != "both":
        return None
    folder = run_pipeline_folder(cfg)
    high, low = (load(folder.transformer_folder(name)) for name in expert_components("both"))
    return NoiseExperts(high, low, boundary=pipeline_boundary(cfg.model.pipeline))
