"""Distributed training checkpoints: one call saves everything a run needs to continue, one call
restores it (at the same or another world size), and a save killed midway never looks complete.

Layout of one checkpoint, ``<root>/<exp_name>_step<N>/``::

    model/               Colossal-AI sharded safetensors (index + shards) of the full model
    optimizer/           Colossal-AI sharded optimizer state (full, un-partitioned; torch files; optional)
    ema.safetensors      full fp32 EMA weights, gathered from the plugin's sharded EMA (optional)
    lr_scheduler.pt      the LR scheduler's state_dict (optional)
    rng/rank<r>.pt       generator states of rank r (see ``rng.py``)
    master/rank<r>.safetensors  ZeRO's fp32 master shards of rank r (bf16/fp16 ZeRO-1/2 only)
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

Mixed precision. Colossal-AI saves a mixed-precision model's *working* weights (e.g. bf16); the
fp32 master shards of ZeRO-1/2 are saved next to them (``master/rank<r>.safetensors``, one file
per rank) and put back on a resume at the same world size, so a bf16 run continues exactly as the
uninterrupted one. At another world size they are rebuilt from the working weights (close, not
identical). ``meta.json`` also records whether the weights were finite; pruning never removes
the last finite checkpoint.
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
OLD_TAG = ".old-"  # a complete checkpoint moved aside while a re-save of its step is published
MASTER_DIR = "master"
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

    A file replaces a file in one atomic ``os.replace``. A folder (which POSIX cannot replace
    atomically) that already exists is first renamed to ``<final>.old-<uid>``, the new one is moved
    in, and only then is the old copy deleted. A kill between the two renames leaves the complete
    old copy under ``*.old-*``, which :func:`list_checkpoints` considers when the final name is
    missing, so there is never a moment without a complete object for this name.
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
            old = f"{final_path}{OLD_TAG}{uid}"
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
            meta = _read_meta(path)
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

def _master_shards(booster, model, optimizer) -> Optional[Dict[str, torch.Tensor]]:
    """This rank's fp32 master-weight shards when the booster's plugin keeps them apart from the
    working weights (ZeRO in bf16/fp16), keyed by parameter name; None otherwise."""
    from ..plugins import OpenDiTPlugin

    if optimizer is None or not isinstance(getattr(booster, "plugin", None), OpenDiTPlugin):
        return None
    shards = booster.plugin.master_weight_shards(model, optimizer)
    return None if shards is None else {k: v.detach().cpu().contiguous() for k, v in shards.items()}


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


def _prune(root: str, exp_name: str, keep_last: int, newest: str, run_id: Optional[str]) -> None:
    """Delete all but the ``keep_last`` newest checkpoints, touching only those that are older than
    the complete checkpoint ``newest`` just published, belong to the same run (``run_id``, when
    given) and only when ``newest`` holds finite weights (so the last finite one always stays)."""
    newest_meta = _read_meta(newest)
    if not newest_meta.get("finite", True):
        logger.warning("keep_last=%d: nothing pruned, %s holds non-finite weights", keep_last, newest)
        return
    ours = []
    for step, path in list_checkpoints(root, exp_name):
        if step >= newest_meta["step"]:
            continue
        try:
            if run_id is not None and _read_meta(path).get("run_id") != run_id:
                continue
        except CheckpointError:
            continue
        ours.append(path)
    for path in ours[:max(0, len(ours) - (keep_last - 1))]:
        logger.info("keep_last=%d: removing %s", keep_last, path)
        os.remove(os.path.join(path, META_FILE))  # first: a kill midway leaves an incomplete folder, never a broken one
        shutil.rmtree(path)


def all_finite(model) -> bool:
    """Whether every rank's parameters of ``model`` are finite (a collective; one host sync)."""
    params = [p.detach() for p in (model.parameters() if model is not None else ()) if p.is_floating_point()]
    if params:
        device = params[0].device
    elif dist.is_initialized() and dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    bad = torch.zeros((), device=device)
    for p in params:
        bad += (~torch.isfinite(p)).any().float()
    if dist.is_initialized() and _world_size() > 1:
        dist.all_reduce(bad)
    return bad.item() == 0


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
    run_id: Optional[str] = None,
) -> str:
    """Collective (every rank calls it): write ``<ckpt_dir_root>/<exp_name>_step<step>/`` atomically
    and return its path.

    ``model``/``optimizer``/``lr_scheduler`` are the objects ``booster.boost`` returned (optimizer
    and scheduler may be None); ``plugin`` is the plugin owning the EMA (its
    ``ema_state_dict(only_rank_0=True)`` is called on every rank, rank 0 writes the result), None
    when there is no EMA. ``extra_state`` (epoch, sampler position, the config as a dict, ...)
    must be JSON-serialisable; :func:`load_checkpoint` returns it with ``step`` added.
    ``keep_last`` > 0 then deletes all but the newest ``keep_last`` complete checkpoints of
    ``exp_name`` (this one included), only older ones, only those saved with the same ``run_id``
    when one is given, and nothing when this checkpoint's weights are not finite; None or 0 keeps
    all. ZeRO's fp32 master shards are saved too (``master/rank<r>.safetensors``), so that a bf16
    run resumed at the same world size continues exactly.
    """
    if int(step) < 0:
        raise ValueError(f"save_checkpoint: step must be >= 0, got {step}")
    if keep_last is not None and int(keep_last) < 0:
        raise ValueError(f"save_checkpoint: keep_last must be >= 1, or 0/None to keep all; got {keep_last}")
    extra = dict(extra_state or {})
    if extra.get("step", step) != step:
        raise ValueError(f"save_checkpoint: extra_state['step']={extra['step']} contradicts step={step}")
    extra.pop("step", None)
    extra = json.loads(json.dumps(extra, default=_json_value))  # fail before writing anything
    rank, world = _rank(), _world_size()
    final = os.path.join(ckpt_dir_root, checkpoint_name(exp_name, step))
    finite = all_finite(model)
    masters = _master_shards(booster, model, optimizer)

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
        if masters is not None:
            if rank == 0:
                os.makedirs(os.path.join(tmp, MASTER_DIR))
            _barrier()
            save_file(masters, os.path.join(tmp, MASTER_DIR, f"rank{rank:05d}.safetensors"))
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
                "has_master_shards": masters is not None,
                "finite": finite,
                "run_id": run_id,
                "torch_version": torch.__version__,
                "extra_state": extra,
                "files": _manifest(tmp),
            }
            with open(os.path.join(tmp, META_FILE), "w") as f:
                json.dump(meta, f, indent=1)
                f.flush()
                os.fsync(f.fileno())

    if keep_last and rank == 0:
        _prune(ckpt_dir_root, exp_name, keep_last, final, run_id)
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


def _load_master_shards(booster, model, optimizer, ckpt_dir: str, meta: Dict[str, Any]) -> None:
    """Put the saved fp32 master shards back (same world size only; elsewhere they are rebuilt from
    the working weights by the booster, and a warning says the run continues close to, not
    exactly as, the uninterrupted one)."""
    from ..plugins import OpenDiTPlugin

    if not meta.get("has_master_shards") or not isinstance(getattr(booster, "plugin", None), OpenDiTPlugin):
        return
    if meta["world_size"] != _world_size():
        if _rank() == 0:
            logger.warning("%s: fp32 master weights were saved by %d ranks and cannot be split for %d; they are "
                           "rebuilt from the working weights", ckpt_dir, meta["world_size"], _world_size())
        return
    path = os.path.join(ckpt_dir, MASTER_DIR, f"rank{_rank():05d}.safetensors")
    try:
        shards = load_file(path)
    except Exception as e:
        raise CheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    with _loading("fp32 master weights", path):
        booster.plugin.load_master_weight_shards(model, optimizer, shards)


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
        _load_master_shards(booster, model, optimizer, ckpt_dir, meta)
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
