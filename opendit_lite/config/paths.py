"""Checks of the output paths a config names, made before anything is computed: a sampling or
evaluation run that would fail to write its result after minutes of work stops at once instead."""

import os
from typing import Optional

from ..errors import ConfigError


def check_output_path(path: Optional[str], key: str, folder: bool = False) -> None:
    """``path`` (the value of setting ``key``) can be written: a file, or a folder (``folder``), its
    missing parent folders created on the way. A ConfigError names what is in the way: a file
    where a folder is needed (the path itself or one of its parents), a folder where a file is
    needed, or a folder this user cannot write to. ``None`` (the default location) passes."""
    if not path:
        return
    full = os.path.abspath(path)
    if os.path.lexists(full):
        if folder and not os.path.isdir(full):
            raise ConfigError(f"'{key}' {path!r} is a file, not a folder: give a folder (it is created if missing).")
        if not folder and os.path.isdir(full):
            raise ConfigError(f"'{key}' {path!r} is a folder: give the path of the file to write in it.")
    nearest = full if folder and os.path.isdir(full) else os.path.dirname(full)
    while not os.path.lexists(nearest):  # the first part of the path that exists
        nearest = os.path.dirname(nearest)
    if not os.path.isdir(nearest):
        raise ConfigError(f"'{key}' {path!r} cannot be written: {nearest!r} is a file, not a folder. Choose a path "
                          f"inside a folder (missing folders are created).")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise ConfigError(f"'{key}' {path!r} cannot be written: this user cannot write to {nearest!r}. Choose a "
                          f"folder you can write to, or fix its permissions.")


INDEX = "model_index.json"  # what makes a folder a diffusers pipeline folder


def check_pipeline_path(folder: Optional[str], what: str = "'model.pipeline'") -> None:
    """``folder`` is a folder holding a diffusers pipeline's model_index.json (the rest of the folder is
    checked where it is read: ``encoders.pipeline_folder``); checked before torch is imported."""
    if not folder or not os.path.isdir(folder):
        raise ConfigError(f"{what} {folder!r} is not a folder: give a local diffusers pipeline folder (the one "
                          f"holding model_index.json, as save_pretrained writes a released model; nothing is "
                          f"downloaded).")
    path = os.path.join(folder, INDEX)
    if not os.path.isfile(path):
        hint = ""
        if os.path.isfile(os.path.join(folder, "config.json")):
            hint = (" It holds a config.json: it is one model's folder (a transformer, VAE or text encoder), not a "
                    "pipeline; give the folder above it that holds model_index.json.")
        raise ConfigError(f"{what} {folder!r} holds no model_index.json, so it is not a diffusers pipeline folder: "
                          f"give the folder of a whole pipeline (model_index.json, transformer/, vae/, the text "
                          f"encoders and tokenizers, scheduler/).{hint}")
