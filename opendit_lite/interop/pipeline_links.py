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

import os
import shutil
from typing import List, Sequence

from ..encoders.pipeline_folder import INDEX, components, read_pipeline_index
from ..errors import ConfigError


def link_pipeline(source: str, output: str, trained: Sequence[str]) -> List[str]:
    """Fill ``output`` (created if needed) with ``source``'s ``model_index.json`` and an absolute link to
    each of its components not in ``trained``; returns the linked names. The trained components must
    be ones ``source`` lists (``read_pipeline_index`` checks the folder); the caller writes them into
    ``output/<name>/``."""
    listed = list(components(read_pipeline_index(source, "the run's model.pipeline")))
    unknown = sorted(set(trained) - set(listed))
    if unknown:
        raise ConfigError(f"the pipeline {source!r} has no component {', '.join(unknown)} (its components: "
                          f"{', '.join(listed)}), so the trained model cannot take its place there.")
    os.makedirs(output, exist_ok=True)
    shutil.copyfile(os.path.join(source, INDEX), os.path.join(output, INDEX))
    linked = []
    for name in listed:
        target = os.path.realpath(os.path.join(source, name))
        if name in trained or not os.path.exists(target):
            continue
        os.symlink(target, os.path.join(output, name), target_is_directory=os.path.isdir(target))
        linked.append(name)
    return linked
