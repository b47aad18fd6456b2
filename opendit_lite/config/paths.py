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
