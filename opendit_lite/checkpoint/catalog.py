"""What a checkpoint folder holds, which folders are complete checkpoints, and whether their files
are intact.

Layout of one checkpoint, ``<root>/<exp_name>_step<N>/`` (written by ``state.save_checkpoint``)::

    model/               Colossal-AI sharded safetensors (index + shards) of the full model
    optimizer/           Colossal-AI sharded optimizer state (full, un-partitioned; torch files; optional)
    ema.safetensors      full fp32 EMA weights, gathered from the sharded EMA (optional)
    lr_scheduler.pt      the LR scheduler's state_dict (optional)
    rng/rank<r>.pt       generator states of rank r (see ``opendit_lite.distributed.rng``)
    master/rank<r>.safetensors  ZeRO's fp32 master shards of rank r (bf16/fp16 ZeRO-1/2 only)
    meta.json            step, caller's extra state (epoch, sampler position, config), world,
                         data- and sequence-parallel sizes, format version, and a manifest
                         (size and CRC-32 of every other file). Written last: it marks completion.

A folder without ``meta.json`` (a save killed before it finished, a partial copy) or under a
``*.tmp-*`` name is never listed. :func:`verify_checkpoint` checks each manifest entry (present,
size, and its CRC-32), so a truncated or corrupted checkpoint raises :class:`CheckpointError` naming
the file instead of failing deep inside a loader.
"""

import json
import logging
import os
import re
import zlib
from typing import Any, Dict, List, Optional, Tuple

from ..errors import CheckpointError
from .files import OLD_TAG

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
DEFAULT_EXP_NAME = "checkpoint"
META_FILE = "meta.json"
MODEL_DIR = "model"
OPTIMIZER_DIR = "optimizer"
EMA_FILE = "ema.safetensors"
LR_SCHEDULER_FILE = "lr_scheduler.pt"
RNG_DIR = "rng"
MASTER_DIR = "master"
_CHUNK = 16 << 20  # bytes read at a time when checksumming


def checkpoint_name(exp_name: str, step: int) -> str:
    """``<exp_name>_step<N>``, LiteGen's prefix for step ``N``."""
    return f"{exp_name}_step{int(step)}"


def read_meta(ckpt_dir: str) -> Dict[str, Any]:
    """The checkpoint's ``meta.json``, checked to be complete metadata of a format this version reads."""
    path = os.path.join(ckpt_dir, META_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{path} is missing: {ckpt_dir} is not a complete checkpoint (its save was interrupted, "
            f"or the folder was not written by save_checkpoint)"
        )
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if not isinstance(meta, dict) or "version" not in meta or "files" not in meta:
        raise CheckpointError(f"{path} is not checkpoint metadata (no 'version'/'files' entries)")
    check_meta_values(meta, path)
    if meta["version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {meta['version']}, newer than this opendit_lite's "
            f"{FORMAT_VERSION}; upgrade opendit_lite to load it"
        )
    return meta


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What save_checkpoint writes in meta.json, by key: anything else is a damaged or hand-edited file that
# would fail later, deep in a resume (a negative step seeds the data order with it) or not at all.
_META_VALUES = (("version", lambda v: _is_int(v) and v >= 1, "a format version >= 1"),
                ("step", lambda v: _is_int(v) and v >= 0, "a step >= 0"),
                ("world_size", lambda v: _is_int(v) and v >= 1, "a world size >= 1"),
                ("files", lambda v: isinstance(v, dict), "the manifest of the checkpoint's files"),
                ("extra_state", lambda v: isinstance(v, dict), "a mapping of the run's state"))


def check_meta_values(meta: Dict[str, Any], path: str) -> None:
    """The entries of checkpoint metadata ``meta`` (read from ``path``) that are present have the
    types and ranges ``save_checkpoint`` writes; a CheckpointError names the first that does not."""
    for key, valid, what in _META_VALUES:
        if key in meta and not valid(meta[key]):
            raise CheckpointError(f"{path} is damaged: its '{key}' is {meta[key]!r}, not {what}")


def is_checkpoint_dir(path: str) -> bool:
    """Whether ``path`` is a complete folder written by ``state.save_checkpoint`` (has its marker)."""
    return os.path.isfile(os.path.join(path, META_FILE))


def list_checkpoints(root: str, exp_name: str = DEFAULT_EXP_NAME) -> List[Tuple[int, str]]:
    """Complete checkpoints ``<root>/<exp_name>_step<N>`` as ``(N, path)``, oldest first.

    Complete means: a folder with this exact name (so never ``*.tmp-*``) holding a readable
    ``meta.json`` for the same step. When that folder is missing or incomplete but a re-save of
    step N was killed between its two renames, the moved-aside ``<name>.old-<uid>`` copy stands in.
    Contents are not checksummed here (see ``verify_checkpoint``).
    """
    if not os.path.isdir(root):
        return []
    pattern = re.compile(rf"{re.escape(exp_name)}_step(\d+)(?:{re.escape(OLD_TAG)}[0-9a-f]+)?")
    found: Dict[int, str] = {}
    for name in sorted(os.listdir(root), key=lambda n: OLD_TAG in n):  # final names first
        match = pattern.fullmatch(name)
        path = os.path.join(root, name)
        if match is None or not os.path.isdir(path):
            continue
        step = int(match.group(1))
        if step in found:
            continue
        try:
            meta = read_meta(path)
        except CheckpointError as e:
            logger.warning("skipping %s: %s", path, e)
            continue
        if meta.get("step") != step:
            logger.warning("skipping %s: its meta.json says step %s", path, meta.get("step"))
            continue
        found[step] = path
    return sorted(found.items())


def find_latest_checkpoint(root: str, exp_name: str = DEFAULT_EXP_NAME) -> Optional[str]:
    """The newest (by step) complete checkpoint of ``exp_name`` under ``root``, or None."""
    found = list_checkpoints(root, exp_name)
    return found[-1][1] if found else None


def _crc32(path: str, fsync: bool = False) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
        if fsync:
            os.fsync(f.fileno())
    return crc


def manifest(ckpt_dir: str) -> Dict[str, Dict[str, int]]:
    """Size and CRC-32 of every file under ``ckpt_dir`` (relative POSIX paths), fsyncing each."""
    files = {}
    for dirpath, _, names in os.walk(ckpt_dir):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ckpt_dir).replace(os.sep, "/")
            files[rel] = {"size": os.path.getsize(path), "crc32": _crc32(path, fsync=True)}
    return files


def verify_checkpoint(ckpt_dir: str, check_content: bool = True) -> Dict[str, Any]:
    """Check a checkpoint against its manifest and return its metadata.

    Raises :class:`CheckpointError` naming the first file that is missing, has the wrong size
    (truncated) or, with ``check_content``, the wrong CRC-32 (corrupted).
    """
    meta = read_meta(ckpt_dir)
    for rel, record in sorted(meta["files"].items()):
        path = os.path.join(ckpt_dir, *rel.split("/"))
        if not os.path.isfile(path):
            raise CheckpointError(f"{path} is missing from checkpoint {ckpt_dir}")
        size = os.path.getsize(path)
        if size != record["size"]:
            raise CheckpointError(
                f"{path} is truncated or altered: {size} bytes, the checkpoint recorded {record['size']}"
            )
        if check_content and _crc32(path) != record["crc32"]:
            raise CheckpointError(f"{path} is corrupted: its CRC-32 differs from the one recorded at save time")
    return meta
