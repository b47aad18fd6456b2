"""Tiny random diffusers pipelines laid out like the seven released models the families fine-tune:
Wan 2.1 (``WanPipeline``), Wan 2.2 A14B (``WanPipeline`` with ``transformer_2`` and
``boundary_ratio``), HunyuanVideo, CogVideoX (5B), LTX-Video, Flux (dev) and SD3.

Each family declares its tiny pipelines in ``<family>/tiny.py`` (its record's ``tiny``); this module
collects them by name. A builder returns the pipeline in memory, every component built from its
library's config at test size (2 heads, widths 8-32, 1-3 layers) with the release's structure: the
text encoders and tokenizer classes its pipeline loads (T5 / UMT5 with ``<pad>`` = 0, ``</s>``,
``<unk>``; CLIP with its start/end tokens and 77 positions; a Llama-3 style byte-level BPE with its
header and end-of-turn tokens), the VAE class with the release's normalisation constants, and the
scheduler configured as the release configures it (shared parts: ``tiny_parts.py``).
``save_tiny_pipeline(name, out)`` writes it with ``save_pretrained``, so that
``DiffusionPipeline.from_pretrained(out)`` loads it and its ``__call__`` runs in seconds on a CPU at
the sizes of ``TINY_CALLS``. Nothing is downloaded.

Nothing here imports diffusers, transformers or tokenizers at import time.
"""

import os
import shutil
from typing import Dict

from ..errors import ConfigError
from .registry import FAMILIES as _REGISTERED
from .tiny_parts import CAPTION_WORDS, TinyPipeline, clip_tokenizer, llama_tokenizer, t5_tokenizer

__all__ = ["CAPTION_WORDS", "FAMILIES", "TINY_CALLS", "TINY_PIPELINES", "TinyPipeline", "build_tiny_pipeline",
           "clip_tokenizer", "llama_tokenizer", "save_tiny_pipeline", "t5_tokenizer"]


def _collect() -> Dict[str, TinyPipeline]:
    tiny: Dict[str, TinyPipeline] = {}
    for family in _REGISTERED.values():
        for pipeline in family.tiny:
            if pipeline.name in tiny:
                raise ValueError(f"tiny pipeline {pipeline.name!r} declared twice (family {family.name!r})")
            tiny[pipeline.name] = pipeline
    return tiny


# name -> its tiny pipeline, from every registered family (the package's import registered them).
TINY_PIPELINES: Dict[str, TinyPipeline] = _collect()
FAMILIES = tuple(TINY_PIPELINES)
# name -> the keyword arguments of a fast ``__call__`` (sizes the VAE and patches divide).
TINY_CALLS: Dict[str, dict] = {name: dict(p.call) for name, p in TINY_PIPELINES.items()}


def _known(name: str) -> TinyPipeline:
    if name not in TINY_PIPELINES:
        raise ConfigError(f"unknown family {name!r} for a tiny pipeline; choose one of {', '.join(FAMILIES)}.")
    return TINY_PIPELINES[name]


def build_tiny_pipeline(name: str, seed: int = 0):
    """The tiny random pipeline ``name`` (one of ``FAMILIES``), in memory, in eval mode."""
    return _known(name).build(seed)


def save_tiny_pipeline(name: str, out: str, seed: int = 0, overwrite: bool = False) -> str:
    """Build the tiny pipeline ``name`` and write it to the folder ``out`` with ``save_pretrained``; an
    existing non-empty ``out`` is a ConfigError unless ``overwrite`` (then it is replaced)."""
    pipeline = _known(name)
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ConfigError(f"the output {out!r} is an existing file; give a folder for the pipeline.")
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise ConfigError(f"the output folder {out!r} is not empty; give a new folder, or pass --overwrite to "
                              f"replace what it holds.")
        shutil.rmtree(out)
    pipeline.build(seed).save_pretrained(out, safe_serialization=True)
    return out
