"""Distributed training checkpoints: one call saves everything a run needs to continue, one call
restores it (at the same or another world size), and a save killed midway never looks complete.

Layout of one checkpoint, ``<root>/<exp_name>_step<N>/``::

    model/               Colossal-AI sharded safetensors (index + shards) of the full model
    optimizer/           Colossal-AI sharded optimizer state (full, un-partitioned; torch files; optional)
    ema.safetensors      full fp32 EMA weights, gathered from the plugin's sharded EMA (optional)
    lr_scheduler.pt      the LR scheduler's state_dict (optional)
    rng/rank<r>.pt       generator states of rank r (see ``rng.py``)
    meta.json            step, caller's extra state (epoch, sampler position, config), world,
                         data- and sequence-parallel sizes, format version, and a manifest
                         (size and CRC-32 of every other file). Written last: it marks completion.

Model and optimizer go through the booster, so each strategy (DDP, ZeRO-1/2, Gemini) gathers its
partitioned state into the same strategy-independent files; that is what makes a checkpoint saved
at 2 ranks load at 1 and the reverse.

Atomicity. Everything is written under ``<name>.tmp-<uid>``; after a barrier (all ranks finished
writing) rank 0 writes ``meta.json`` and renames the folder to its final name. A process killed
before the rename leaves only the ``*.tmp-*`` folder, which :func:`find_latest_checkpoint` never
returns; a folder without ``meta.json`` (e.g. a partial copy) is ignored as well. Leftover
``*.tmp-*`` folders can be deleted by hand. The root must be a file system every rank sees.

Safety and integrity. Loading never unpickles arbitrary objects: weights are safetensors, and the
torch files (optimizer shards, LR scheduler, RNG) are read with ``weights_only`` forced on, also
inside Colossal-AI's loaders. Before loading, rank 0 checks each manifest entry (present, size,
and with ``verify=True`` its CRC-32), so a truncated or corrupted checkpoint raises
:class:`CheckpointError` naming the file on every rank instead of failing deep inside a loader.
Saving reads every file back once for the checksum (and fsyncs it): about one extra read of the
checkpoint on rank 0, from the page cache.

Note that Colossal-AI saves a mixed-precision model's *working* weights (e.g. bf16); ZeRO's fp32
master weights are re-created from them on load, so a bf16 run resumed from a checkpoint is close
to, not bit-identical with, the uninterrupted run (fp32 runs are identical).
"""

import dataclasses
import json
import logging
import os
import re
import shutil
import uuid
import zlib
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from ..distributed.rng import get_rng_state, set_rng_state

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
DEFAULT_EXP_NAME = "checkpoint"
META_FILE = "meta.json"
MODEL_DIR = "model"
OPTIMIZER_DIR = "optimizer"
EMA_FILE = "ema.safetensors"
LR_SCHEDULER_FILE = "lr_scheduler.pt"
RNG_DIR = "rng"
TMP_TAG = ".tmp-"
_CHUNK = 16 << 20  # bytes read at a time when checksumming


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, truncated or corrupted; the message names the file."""


# --------------------------------------------------------------------------------------------------
# Process-group helpers (they also work without an initialised group: a world of one)
# --------------------------------------------------------------------------------------------------

def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if _world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# --------------------------------------------------------------------------------------------------
# Atomic publication and safe loading (also used by the LiteGen facade)
# --------------------------------------------------------------------------------------------------

def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


@contextmanager
def atomic_path(final_path: str) -> Iterator[str]:
    """Collective: yields the same temporary sibling of ``final_path`` on every rank; when the block
    has completed on every rank, rank 0 renames it to ``final_path`` (file or folder), replacing an
    older one, and every rank waits for the rename.

    A file replaces a file in one atomic ``os.replace``. Otherwise (folders, which POSIX cannot
    replace atomically) an existing ``final_path`` is first moved aside and deleted only after the
    new one is in place. Either way a half-written object never carries the final name.
    """
    uid = _from_rank0(uuid.uuid4().hex[:12])
    tmp = f"{final_path}{TMP_TAG}{uid}"
    if _rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(final_path)), exist_ok=True)
    _barrier()
    yield tmp
    _barrier()
    if _rank() == 0:
        if not os.path.lexists(tmp):
            raise CheckpointError(f"nothing was written to {tmp}; cannot publish {final_path}")
        old = None
        if os.path.isdir(final_path) or (os.path.lexists(final_path) and os.path.isdir(tmp)):
            old = f"{final_path}.old-{uid}"
            os.rename(final_path, old)
        os.replace(tmp, final_path)
        if old is not None:
            _remove(old)
    _barrier()


@contextmanager
def weights_only_loads() -> Iterator[None]:
    """Force ``torch.load(weights_only=True)`` in this block, including in library code we do not
    own (Colossal-AI's optimizer and scheduler loaders), whatever the environment says otherwise.

    torch reads ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` at every ``torch.load`` call and lets it override
    an explicit ``weights_only=False``; ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` must be unset meanwhile
    because torch refuses both at once.
    """
    saved = {k: os.environ.get(k) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load_torch_file(path: str) -> Any:
    """``torch.load`` of tensors/containers only, onto the CPU; a bad file raises naming it."""
    try:
        with weights_only_loads():
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from e


# --------------------------------------------------------------------------------------------------
# Names, discovery and verification
# --------------------------------------------------------------------------------------------------

def checkpoint_name(exp_name: str, step: int) -> str:
    """``<exp_name>_step<N>``, LiteGen's prefix for step ``N``."""
    return f"{exp_name}_step{int(step)}"


def _read_meta(ckpt_dir: str) -> Dict[str, Any]:
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
    if meta["version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {meta['version']}, newer than this opendit_lite's "
            f"{FORMAT_VERSION}; upgrade opendit_lite to load it"
        )
    return meta


def is_checkpoint_dir(path: str) -> bool:
    """Whether ``path`` is a complete folder written by :func:`save_checkpoint` (has its marker)."""
    return os.path.isfile(os.path.join(path, META_FILE))


def list_checkpoints(root: str, exp_name: str = DEFAULT_EXP_NAME) -> List[Tuple[int, str]]:
    """Complete checkpoints ``<root>/<exp_name>_step<N>`` as ``(N, path)``, oldest first.

    Complete means: a folder with this exact name (so never ``*.tmp-*``) holding a readable
    ``meta.json`` for the same step. Contents are not checksummed here (see ``verify_checkpoint``).
    """
    if not os.path.isdir(root):
        return []
    pattern = re.compile(rf"{re.escape(exp_name)}_step(\d+)")
    found = []
    for name in os.listdir(root):
        match = pattern.fullmatch(name)
        path = os.path.join(root, name)
        if match is None or not os.path.isdir(path):
            continue
        try:
            meta = _read_meta(path)
        except CheckpointError as e:
            logger.warning("skipping %s: %s", path, e)
            continue
        if meta.get("step") != int(match.group(1)):
            logger.warning("skipping %s: its meta.json says step %s", path, meta.get("step"))
            continue
        found.append((int(match.group(1)), path))
    return sorted(found)


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


def _manifest(ckpt_dir: str) -> Dict[str, Dict[str, int]]:
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
    meta = _read_meta(ckpt_dir)
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


# --------------------------------------------------------------------------------------------------
# Save
# --------------------------------------------------------------------------------------------------

def _json_value(obj: Any) -> Any:
    """``json.dumps`` fallback for the few non-JSON types extra state commonly holds."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy / torch scalars
        return obj.item()
    raise TypeError(
        f"extra_state holds a {type(obj).__name__}, which meta.json cannot store; pass numbers, "
        f"strings, lists, dicts or dataclasses (e.g. the config as a dict)"
    )


def _prune(root: str, exp_name: str, keep_last: int) -> None:
    for _, path in list_checkpoints(root, exp_name)[:-keep_last]:
        logger.info("keep_last=%d: removing %s", keep_last, path)
        shutil.rmtree(path)


def save_checkpoint(
    booster,
    ckpt_dir_root: str,
    step: int,
    model,
    optimizer,
    lr_scheduler=None,
    plugin=None,
    extra_state: Optional[Dict[str, Any]] = None,
    keep_last: Optional[int] = None,
    exp_name: str = DEFAULT_EXP_NAME,
) -> str:
    """Collective (every rank calls it): write ``<ckpt_dir_root>/<exp_name>_step<step>/`` atomically
    and return its path.

    ``model``/``optimizer``/``lr_scheduler`` are the objects ``booster.boost`` returned (optimizer
    and scheduler may be None); ``plugin`` is the plugin owning the EMA (its
    ``ema_state_dict(only_rank_0=True)`` is called on every rank, rank 0 writes the result), None
    when there is no EMA. ``extra_state`` (epoch, sampler position, the config as a dict, ...)
    must be JSON-serialisable; :func:`load_checkpoint` returns it with ``step`` added.
    ``keep_last`` > 0 then deletes all but the newest ``keep_last`` complete checkpoints of
    ``exp_name`` (this one included); None or 0 keeps all.
    """
    if int(step) < 0:
        raise ValueError(f"save_checkpoint: step must be >= 0, got {step}")
    extra = dict(extra_state or {})
    if extra.get("step", step) != step:
        raise ValueError(f"save_checkpoint: extra_state['step']={extra['step']} contradicts step={step}")
    extra.pop("step", None)
    extra = json.loads(json.dumps(extra, default=_json_value))  # fail before writing anything
    rank, world = _rank(), _world_size()
    final = os.path.join(ckpt_dir_root, checkpoint_name(exp_name, step))

    with atomic_path(final) as tmp:
        if rank == 0:
            os.makedirs(os.path.join(tmp, RNG_DIR))
        _barrier()
        booster.save_model(model, os.path.join(tmp, MODEL_DIR), shard=True, use_safetensors=True)
        if optimizer is not None:
            booster.save_optimizer(optimizer, os.path.join(tmp, OPTIMIZER_DIR), shard=True)
        if lr_scheduler is not None:
            booster.save_lr_scheduler(lr_scheduler, os.path.join(tmp, LR_SCHEDULER_FILE))
        if plugin is not None:
            ema = plugin.ema_state_dict(only_rank_0=True)  # collective; only rank 0 holds the result
            if rank == 0:
                save_file({k: v.detach().cpu().contiguous() for k, v in ema.items()}, os.path.join(tmp, EMA_FILE))
        torch.save(get_rng_state(), os.path.join(tmp, RNG_DIR, f"rank{rank:05d}.pt"))
        _barrier()  # every rank's files are on disk before rank 0 lists them
        if rank == 0:
            meta = {
                "format": "opendit_lite.checkpoint",
                "version": FORMAT_VERSION,
                "step": int(step),
                "exp_name": exp_name,
                "world_size": world,
                "dp_size": getattr(booster.plugin, "dp_size", world),
                "sp_size": getattr(booster.plugin, "sp_size", 1),
                "zero_degree": getattr(booster.plugin, "zero_degree", None),
                "has_optimizer": optimizer is not None,
                "has_ema": plugin is not None,
                "has_lr_scheduler": lr_scheduler is not None,
                "torch_version": torch.__version__,
                "extra_state": extra,
                "files": _manifest(tmp),
            }
            with open(os.path.join(tmp, META_FILE), "w") as f:
                json.dump(meta, f, indent=1)
                f.flush()
                os.fsync(f.fileno())

    if keep_last and rank == 0:
        _prune(ckpt_dir_root, exp_name, keep_last)
    _barrier()
    return final


# --------------------------------------------------------------------------------------------------
# Load
# --------------------------------------------------------------------------------------------------

def _verified_meta(ckpt_dir: str, check_content: bool) -> Dict[str, Any]:
    """Rank 0 verifies; every rank gets the metadata or raises the same error (no rank hangs)."""
    result = None
    if _rank() == 0:
        try:
            result = ("ok", verify_checkpoint(ckpt_dir, check_content))
        except (CheckpointError, OSError) as e:
            result = ("error", str(e))
    status, value = _from_rank0(result)
    if status == "error":
        raise CheckpointError(value)
    return value


@contextmanager
def _loading(what: str, path: str) -> Iterator[None]:
    try:
        with weights_only_loads():
            yield
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"cannot load the {what} from {path}: {type(e).__name__}: {e}") from e


def load_ema_file(plugin, path: str) -> None:
    """Load a full EMA state dict (safetensors, or a torch file read weights-only) into ``plugin``."""
    if path.endswith(".safetensors"):
        try:
            state = load_file(path)
        except Exception as e:
            raise CheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    else:
        state = load_torch_file(path)
    with _loading("EMA", path):
        plugin.load_ema_state_dict(state)


def load_model_weights(booster, model, path: str, strict: bool = True) -> None:
    """Collective: load weights only into a boosted ``model`` from a single file (``.pth``/``.pt``
    state dict or ``.safetensors``), a Colossal-AI sharded folder, or a checkpoint folder written
    by :func:`save_checkpoint` (its ``model/``). Torch files are read weights-only."""
    if is_checkpoint_dir(path):
        path = os.path.join(path, MODEL_DIR)
    if not os.path.exists(path):
        raise CheckpointError(f"{path} does not exist: no model weights to load")
    with _loading("model", path):
        booster.load_model(model, path, strict=strict)


def load_optimizer_state(booster, optimizer, path: str) -> None:
    """Collective: load a boosted ``optimizer`` from a file or a sharded folder (any world size)."""
    if not os.path.exists(path):
        raise CheckpointError(f"{path} does not exist: no optimizer state to load")
    with _loading("optimizer state", path):
        booster.load_optimizer(optimizer, path)


def load_checkpoint(
    booster,
    ckpt_dir: str,
    model,
    optimizer=None,
    lr_scheduler=None,
    plugin=None,
    load_rng: bool = True,
    verify: bool = True,
    strict: bool = True,
) -> Dict[str, Any]:
    """Collective: restore a checkpoint written by :func:`save_checkpoint`; return its extra state
    with ``step`` added.

    Pass None for a part you do not want restored; a part you ask for that the checkpoint lacks
    (optimizer, LR scheduler, EMA) is an error. ``verify`` checksums every file first (``False``: sizes
    only). RNG states are restored only at the world size they were saved at (each rank its own);
    at another world size a warning says they were not, and the current seeds stay in effect.
    """
    meta = _verified_meta(ckpt_dir, check_content=verify)
    load_model_weights(booster, model, os.path.join(ckpt_dir, MODEL_DIR), strict=strict)
    if optimizer is not None:
        path = os.path.join(ckpt_dir, OPTIMIZER_DIR)
        if not meta["has_optimizer"]:
            raise CheckpointError(f"{path} does not exist: the checkpoint was saved without an optimizer")
        load_optimizer_state(booster, optimizer, path)
    if lr_scheduler is not None:
        path = os.path.join(ckpt_dir, LR_SCHEDULER_FILE)
        if not meta["has_lr_scheduler"]:
            raise CheckpointError(f"{path} does not exist: the checkpoint was saved without an LR scheduler")
        with _loading("LR scheduler", path):
            booster.load_lr_scheduler(lr_scheduler, path)
    if plugin is not None:
        path = os.path.join(ckpt_dir, EMA_FILE)
        if not meta["has_ema"]:
            raise CheckpointError(f"{path} does not exist: the checkpoint was saved without an EMA")
        load_ema_file(plugin, path)
    if load_rng:
        if meta["world_size"] == _world_size():
            set_rng_state(load_torch_file(os.path.join(ckpt_dir, RNG_DIR, f"rank{_rank():05d}.pt")))
        elif _rank() == 0:
            logger.warning(
                "%s was saved by %d ranks and is loaded by %d: RNG states are not restored "
                "(random streams continue from the current seeds)", ckpt_dir, meta["world_size"], _world_size(),
            )
    return dict(meta["extra_state"], step=meta["step"])
