"""A diffusers pipeline folder around the transformers a run trained, without copying what it did not
train: ``model_index.json`` is copied from the pipeline the run started from, every component the run
left untouched (text encoders, tokenizers, VAE, scheduler: most of the bytes) is a symbolic link to
that pipeline's own folder, and the trained components are left for the caller to write fresh
(``export_family``). ``DiffusionPipeline.from_pretrained(out)`` then loads the fine-tuned pipeline.

    link_pipeline("/models/Wan2.2-T2V-A14B-Diffusers", "out", trained=("transformer", "transformer_2"))
    export_family(model, "out/transformer", state=ema)        # and transformer_2 likewise

Why links: diffusers reads each component from ``<folder>/<name>/`` (``model_index.json`` names a
library and a class per component, never another folder), so a component is either in the folder or
reached through it. The links are absolute, to the source's real path: the export keeps loading
when the run folder is moved or copied elsewhere on the machine (a relative link would break unless
both moved together); it needs the source pipeline to stay where it was, as the run itself did.
"""

import json
import os
import shutil
from typing import Dict, List, Sequence

from ..errors import ConfigError

MODEL_INDEX = "model_index.json"


def read_model_index(folder: str) -> Dict:
    """The pipeline's ``model_index.json`` as a dict; a ConfigError when ``folder`` holds none."""
    path = os.path.join(folder, MODEL_INDEX)
    if not os.path.isfile(path):
        raise ConfigError(f"{folder!r} holds no {MODEL_INDEX}, so it is not a diffusers pipeline folder: point "
                          f"model.pipeline at the folder save_pretrained wrote (model_index.json, transformer/, "
                          f"vae/, ...).")
    with open(path) as f:
        return json.load(f)


def pipeline_components(folder: str) -> List[str]:
    """The components ``model_index.json`` lists (a ``[library, class]`` pair, not null), in its order."""
    index = read_model_index(folder)
    return [name for name, value in index.items()
            if not name.startswith("_") and isinstance(value, list) and len(value) == 2 and value[0] is not None]


def link_pipeline(source: str, output: str, trained: Sequence[str]) -> List[str]:
    """Fill ``output`` (created if needed) with ``source``'s ``model_index.json`` and an absolute link to
    each of its components not in ``trained``; returns the linked names. The trained components must
    be ones ``source`` lists; the caller writes them into ``output/<name>/``."""
    components = pipeline_components(source)
    unknown = sorted(set(trained) - set(components))
    if unknown:
        raise ConfigError(f"the pipeline {source!r} has no component {', '.join(unknown)} (its components: "
                          f"{', '.join(components)}), so the trained model cannot take its place there.")
    os.makedirs(output, exist_ok=True)
    shutil.copyfile(os.path.join(source, MODEL_INDEX), os.path.join(output, MODEL_INDEX))
    linked = []
    for name in components:
        target = os.path.realpath(os.path.join(source, name))
        if name in trained or not os.path.exists(target):
            continue
        os.symlink(target, os.path.join(output, name), target_is_directory=os.path.isdir(target))
        linked.append(name)
    return linked
