"""Temporary objects of interrupted saves (``<name>.tmp-<uid>-<pid>@<host>``, see ``files.py``):
found, and removed when no live process owns them.

A save killed midway (``kill -9``, a node lost) leaves its temporary folder behind; readers never
take it for a checkpoint, but it holds a checkpoint's worth of disk. A run removes those of its own
experiment at start-up, before training, while it holds the run folder's lock (so no other run of
the same experiment writes there): each one whose owner process is gone (same host, pid dead), and
each one from a version that did not stamp an owner. A folder whose owner is alive, or runs on
another host, is left alone, and so is everything of other experiments.
"""

import os
import re
from typing import List

from ..utils.processes import owner_alive, parse_stamp
from .files import TMP_TAG, remove_path


def orphaned_tmp(root: str, exp_name: str) -> List[str]:
    """Paths under ``root`` of ``exp_name``'s temporary checkpoint objects (folders, or LiteGen's
    files) whose owner is not alive."""
    if not os.path.isdir(root):
        return []
    pattern = re.compile(rf"{re.escape(exp_name)}_step\d+(?:\.[\w.]+)?{re.escape(TMP_TAG)}([0-9a-f]+)(?:-(.+))?")
    found = []
    for name in sorted(os.listdir(root)):
        match = pattern.fullmatch(name)
        if match is None:
            continue
        owner = parse_stamp(match.group(2)) if match.group(2) else None
        if match.group(2) and owner is None:
            continue  # not a name we write
        if owner is None or not owner_alive(*owner):
            found.append(os.path.join(root, name))
    return found


def remove_orphaned_tmp(root: str, exp_name: str) -> List[str]:
    """Remove ``orphaned_tmp(root, exp_name)``; returns what was removed (rank 0 only, at start-up)."""
    removed = []
    for path in orphaned_tmp(root, exp_name):
        try:
            remove_path(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed
