"""A diffusers-family run's checkpoint -> a folder its diffusers class loads (``from_pretrained``):
what ``train_video.py`` writes to ``<run dir>/diffusers/`` at the end of a run and
``scripts/export_diffusers.py --checkpoint`` writes on demand.

The model is rebuilt from the run's saved ``model`` section (the class ``name`` and its ``config``,
or the ``config.json`` of its ``path`` or of its ``pipeline``'s transformer) on the meta device: no
weight is allocated, the checkpoint's weights are assigned by ``diffusers_export.export_family``. A
LoRA run (its saved ``lora`` section) gets the same adapters first, so their scaling is known and
the export merges them or writes them as an adapter file.
"""

import json
import os
from typing import Optional

import torch
import torch.nn as nn

from ..checkpoint.files import atomic_path
from ..checkpoint.weights import read_weights
from ..distributed.ranks import from_rank0, global_rank
from ..errors import CheckpointError, ConfigError
from ..families import is_family
from ..models.lora import apply_lora
from .diffusers_export import export_family


def _family_config(model: dict) -> dict:
    """The diffusers constructor arguments of the run's model section."""
    if model.get("config"):
        return dict(model["config"])
    path = os.path.join(model["pipeline"], "transformer") if model.get("pipeline") else model.get("path")
    config = os.path.join(path or "", "config.json")
    if not path or not os.path.isfile(config):
        where = "model.pipeline's transformer" if model.get("pipeline") else "model.path"
        raise ConfigError(f"the run's model {model.get('name')} was loaded from {where} {path!r}, whose "
                          f"config.json is needed to rebuild it and is no longer there; restore that folder.")
    with open(config) as f:
        return json.load(f)


def family_model_skeleton(model: dict, lora: Optional[dict] = None) -> nn.Module:
    """The run's diffusers model, built on the meta device from its saved ``model`` section (with
    its LoRA adapters when ``lora`` has a rank)."""
    import diffusers

    cls = getattr(diffusers, model["name"], None) if is_family(model["name"]) else None
    if cls is None:
        raise ConfigError(f"model.name {model['name']!r} is not a diffusers class of a registered family; only "
                          f"diffusers-family runs export with this route.")
    with torch.device("meta"):
        skeleton = cls.from_config(_family_config(model))
        if lora and lora.get("rank"):
            apply_lora(skeleton, rank=lora["rank"], alpha=lora["alpha"], dropout=lora.get("dropout", 0.0),
                       targets=lora.get("targets"))
    return skeleton


def export_family_checkpoint(model: dict, lora: Optional[dict], checkpoint: str, output: str, *,
                             use_ema: bool = True, lora_mode: str = "merged") -> str:
    """Write ``checkpoint`` (the EMA where kept and ``use_ema``) of a run whose saved sections are
    ``model`` and ``lora`` as a diffusers folder at ``output``, published when complete (an earlier
    export there is replaced). Collective when a process group is up: rank 0 writes."""
    if lora_mode == "adapter" and not (lora and lora.get("rank")):
        raise ConfigError("--lora adapter (export.lora: adapter) needs a LoRA run; this run trained every weight "
                          "(lora.rank 0), so there is no adapter to write: export it merged.")
    skeleton = family_model_skeleton(model, lora)
    with atomic_path(output) as tmp:
        failure = None
        if global_rank() == 0:
            try:
                _write(skeleton, checkpoint, tmp, use_ema, lora_mode)
            except (CheckpointError, ConfigError) as e:
                failure = (type(e), str(e))
        failure = from_rank0(failure)  # every rank leaves the block the same way: no one waits for a peer
        if failure is not None:
            raise failure[0](failure[1])
    return output


def _write(skeleton: nn.Module, checkpoint: str, folder: str, use_ema: bool, lora_mode: str) -> None:
    try:
        state = read_weights(checkpoint, use_ema=use_ema)
    except (FileNotFoundError, ValueError) as e:
        raise CheckpointError(f"cannot read the weights of {checkpoint!r}: {e}") from None
    export_family(skeleton, folder, state=state, lora=lora_mode)
