"""A diffusers-family run's checkpoint -> what its pipeline loads: what ``train_video.py`` writes to
``<run dir>/diffusers/`` at the end of a run and ``scripts/export_diffusers.py --checkpoint`` writes on
demand. Three layouts, by the run's saved ``model`` and ``lora`` sections and the mode:

* a LoRA run, ``lora_mode="adapter"`` (the default for LoRA runs): the adapters alone, no base
  weights, in the formats ``lora_format`` names: ``<out>/pytorch_lora_weights.safetensors`` in the
  pipeline's LoRA format (``export_lora``; ``<Pipeline>.load_lora_weights(out)`` puts them on the
  pipeline's ``transformer``) and/or ``<out>/comfyui_lora.safetensors`` under the family's original
  checkpoint names (``original_lora.export_original_lora``; ComfyUI's LoRA loader, and
  ``load_lora_weights(out, weight_name="comfyui_lora.safetensors")`` where diffusers converts the
  family's layout). Wan 2.2's low-noise expert's go to ``<out>/transformer_2/``, loaded with
  ``load_lora_weights(out + "/transformer_2", load_into_transformer_2=True)``;
* a run from ``model.pipeline`` (full training, or LoRA merged): a pipeline folder,
  ``DiffusionPipeline.from_pretrained(out)``, with each trained transformer written fresh and every
  other component linked to the source pipeline, not copied (``pipeline_links.link_pipeline``);
* otherwise (``model.path`` or ``model.config``): the transformer's own folder,
  ``<Class>.from_pretrained(out)``.

Each trained transformer is rebuilt from the run's saved ``model`` section (the class ``name`` and
its ``config``, or the ``config.json`` of its folder) on the meta device: no weight is allocated, the
checkpoint's weights are assigned by ``export_family`` / ``export_lora``. A LoRA run (its saved
``lora`` section) gets the same adapters first, so their scaling and config are known. Wan 2.2's two
experts (``model.expert: both``) are one ``NoiseExperts`` module in the checkpoint, its keys under
``transformer.`` and ``transformer_2.``; each is exported from its part.
"""

import json
import os
from typing import Dict, Optional

import torch
import torch.nn as nn

from ..checkpoint.files import atomic_path
from ..checkpoint.weights import read_weights
from ..distributed.ranks import from_rank0, global_rank
from ..errors import CheckpointError, ConfigError
from ..families import family_of, is_family
from ..models.experts import expert_components
from ..models.lora import apply_lora
from .comfyui_lora import LORA_FORMATS, export_original_lora, require_original_layout
from .diffusers_export import export_family, export_lora
from .pipeline_links import link_pipeline


def _component_folder(model: dict, component: str) -> Optional[str]:
    """The folder the run loaded ``component`` from: the pipeline's sub-folder, else ``model.path``."""
    return os.path.join(model["pipeline"], component) if model.get("pipeline") else model.get("path")


def _family_config(model: dict, component: str = "transformer") -> dict:
    """The diffusers constructor arguments of the run's ``component`` (its transformers share ``model.config``
    when randomly initialised)."""
    if model.get("config"):
        return dict(model["config"])
    folder = _component_folder(model, component)
    config = os.path.join(folder or "", "config.json")
    if not folder or not os.path.isfile(config):
        where = f"model.pipeline's {component}" if model.get("pipeline") else "model.path"
        raise ConfigError(f"the run's model {model.get('name')} was loaded from {where} {folder!r}, whose "
                          f"config.json is needed to rebuild it and is no longer there; restore that folder.")
    with open(config) as f:
        return json.load(f)


def family_model_skeleton(model: dict, lora: Optional[dict] = None, component: str = "transformer") -> nn.Module:
    """The run's diffusers model ``component`` (a pipeline's ``transformer`` or ``transformer_2``),
    built on the meta device from its saved ``model`` section (with its LoRA adapters when ``lora`` has
    a rank)."""
    import diffusers

    cls = getattr(diffusers, model["name"], None) if is_family(model["name"]) else None
    if cls is None:
        raise ConfigError(f"model.name {model['name']!r} is not a diffusers class of a registered family; only "
                          f"diffusers-family runs export with this route.")
    with torch.device("meta"):
        skeleton = cls.from_config(_family_config(model, component))
        if lora and lora.get("rank"):
            apply_lora(skeleton, rank=lora["rank"], alpha=lora["alpha"], dropout=lora.get("dropout", 0.0),
                       targets=lora.get("targets"))
    return skeleton


def default_lora_format(model_name: str) -> str:
    """A LoRA run's adapter files when none is chosen: both formats for a family that declares an
    original checkpoint layout (a ComfyUI user finds their file without asking), the diffusers format
    otherwise."""
    family = family_of(model_name)
    return "both" if family is not None and family.original_lora is not None else "diffusers"


def check_lora_format(model_name: str, lora_format: str) -> None:
    """A ConfigError when ``lora_format`` is no format, or names the ComfyUI file for a family without
    an original layout."""
    if lora_format not in LORA_FORMATS:
        raise ConfigError(f"lora_format={lora_format!r} is not a LoRA file format; use one of "
                          f"{', '.join(LORA_FORMATS)}.")
    if lora_format != "diffusers":
        require_original_layout(family_of(model_name), model_name)


def export_family_checkpoint(model: dict, lora: Optional[dict], checkpoint: str, output: str, *,
                             use_ema: bool = True, lora_mode: str = "merged", lora_format: str = "diffusers") -> str:
    """Write ``checkpoint`` (the EMA where kept and ``use_ema``) of a run whose saved sections are
    ``model`` and ``lora`` to ``output`` in the layout of the module docstring, published when complete
    (an earlier export there is replaced). Collective when a process group is up: rank 0 writes.
    ``lora_format``: the adapter file(s) of ``lora_mode="adapter"``: "diffusers", "comfyui" or "both"."""
    if lora_mode == "adapter" and not (lora and lora.get("rank")):
        raise ConfigError("--lora adapter (export.lora: adapter) needs a LoRA run; this run trained every weight "
                          "(lora.rank 0), so there is no adapter to write: export it merged.")
    check_lora_format(model["name"], lora_format)
    components = expert_components(model.get("expert"))
    skeletons = {c: family_model_skeleton(model, lora, c) for c in components}
    with atomic_path(output) as tmp:
        failure = None
        if global_rank() == 0:
            try:
                write_export(model, lora, checkpoint, tmp, use_ema=use_ema, lora_mode=lora_mode, skeletons=skeletons,
                             lora_format=lora_format)
            except (CheckpointError, ConfigError) as e:
                failure = (type(e), str(e))
        failure = from_rank0(failure)  # every rank leaves the block the same way: no one waits for a peer
        if failure is not None:
            raise failure[0](failure[1])
    return output


def _parts(state: Dict[str, torch.Tensor], components) -> Dict[str, Dict[str, torch.Tensor]]:
    """Each component's weights: the keys under ``<component>.`` of a ``NoiseExperts`` checkpoint, or
    the whole state of a one-transformer run."""
    if len(components) == 1:
        return {components[0]: state}
    return {c: {k[len(c) + 1:]: v for k, v in state.items() if k.startswith(c + ".")} for c in components}


def write_export(model: dict, lora: Optional[dict], checkpoint: str, folder: str, *, use_ema: bool, lora_mode: str,
                 skeletons: Optional[Dict[str, nn.Module]] = None, lora_format: str = "diffusers") -> None:
    """Write ``checkpoint``'s export (the module docstring's layouts) into the existing folder ``folder``,
    in this process alone (``export_family_checkpoint`` publishes it from rank 0; a sampler writes a
    LoRA run's adapters on every rank, to load them with the pipeline's ``load_lora_weights``).
    ``skeletons``: the components built by ``family_model_skeleton`` (None: built here); ``lora_format``:
    the adapter file(s) written in "adapter" mode ("diffusers", "comfyui" or "both")."""
    if skeletons is None:
        skeletons = {c: family_model_skeleton(model, lora, c) for c in expert_components(model.get("expert"))}
    try:
        state = read_weights(checkpoint, use_ema=use_ema)
    except (FileNotFoundError, ValueError) as e:
        raise CheckpointError(f"cannot read the weights of {checkpoint!r}: {e}") from None
    parts = _parts(state, list(skeletons))
    if lora_mode == "adapter":  # the adapters alone; the low-noise expert's in transformer_2/
        for component, skeleton in skeletons.items():
            out = folder if component == "transformer" else os.path.join(folder, component)
            if lora_format in ("diffusers", "both"):
                export_lora(skeleton, out, state=parts[component])  # the family's pipeline class
            if lora_format in ("comfyui", "both"):
                export_original_lora(skeleton, out, state=parts[component])  # the original checkpoint's names
        return
    if model.get("pipeline"):  # a pipeline folder: the trained transformers fresh, the rest linked
        link_pipeline(model["pipeline"], folder, trained=list(skeletons))
        for component, skeleton in skeletons.items():
            export_family(skeleton, os.path.join(folder, component), state=parts[component], lora="merged")
        return
    (component, skeleton), = skeletons.items()
    export_family(skeleton, folder, state=parts[component], lora="merged")
