"""Distributed training checkpoints: one call saves everything a run needs to continue, one call
restores it (at the same or another world size), and a save killed midway never looks complete.

What a checkpoint folder holds and how it is verified is in ``catalog.py``; how it is published
atomically and read without unpickling anything but tensors, in ``files.py``.

Model and optimizer go through the booster, so each strategy (DDP, ZeRO-1/2, Gemini) gathers its
partitioned state into the same strategy-independent files; that is what makes a checkpoint saved
at 2 ranks load at 1 and the reverse. The EMA and the booster plugin are reached through two small
interfaces (``EMAState``, ``MasterWeightShards``), so any EMA or plugin with those methods works.

Atomicity. Everything is written under ``<name>.tmp-<uid>``, one part after the other (folders,
model, optimizer, LR scheduler, EMA, RNG, master shards); after each part the ranks agree that every
one of them wrote its share (``files.PartialCopy``); then rank 0 writes ``meta.json`` and renames
the folder to its final name. A process killed before the rename leaves only the ``*.tmp-*`` folder,
which ``catalog.find_latest_checkpoint`` never returns; a later run of the same experiment removes
it at start-up (``litter.py``). The root must be a file system every rank sees.

Room. Before writing, rank 0 checks the free space against the size of the newest checkpoint of the
experiment; a save that still fails for want of room (ENOSPC, EFBIG, EDQUOT, EROFS) on any rank, or
whose partial folder disappears, ends on every rank with the same :class:`StorageError` (the rank
and the part named) after the part that failed; rank 0 then removes the partial folder. Every
complete checkpoint stays in place, so a retry with ``auto_resume`` continues from the newest one
once space is freed. No rank waits for one that has left: the agreement replaces the barriers
between parts.

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
import shutil
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from ..distributed.ranks import barrier, collective_device, from_rank0, global_rank, global_world_size
from ..distributed.rng import get_rng_state, set_rng_state
from ..errors import CheckpointError, StorageError
from .catalog import (
    DEFAULT_EXP_NAME,
    EMA_FILE,
    FORMAT_VERSION,
    LR_SCHEDULER_FILE,
    MASTER_DIR,
    META_FILE,
    MODEL_DIR,
    OPTIMIZER_DIR,
    RNG_DIR,
    checkpoint_name,
    is_checkpoint_dir,
    list_checkpoints,
    manifest,
    read_meta,
    verify_checkpoint,
)
from .files import WriteFailed, collective_write, load_torch_file, weights_only_loads
from .write_failures import storage_failure

logger = logging.getLogger(__name__)


class EMAState(Protocol):
    """The EMA a checkpoint saves and restores (``opendit_lite.ema.ShardedEMA``)."""

    def state_dict(self, only_rank_0: bool = False) -> Dict[str, torch.Tensor]:
        """The full EMA as a state dict (a collective; with ``only_rank_0`` other ranks get {})."""

    def load_state_dict(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Load a full EMA state dict saved at any world size."""

    def reset(self) -> None:
        """Make the EMA equal to the current weights (a resumed run without a saved EMA)."""


@runtime_checkable
class MasterWeightShards(Protocol):
    """A booster plugin that keeps fp32 master weights apart from the working weights
    (``OpenDiTPlugin`` under ZeRO in bf16/fp16); a checkpoint saves and restores them."""

    def master_weight_shards(self, model, optimizer) -> Optional[Dict[str, torch.Tensor]]:
        """This rank's fp32 master shards by parameter name, or None when there are none apart."""

    def load_master_weight_shards(self, model, optimizer, shards: Dict[str, torch.Tensor]) -> None:
        """Put shards of the same world size back."""


def _master_shards(booster, model, optimizer) -> Optional[Dict[str, torch.Tensor]]:
    """This rank's fp32 master-weight shards when the booster's plugin keeps them apart from the
    working weights (ZeRO in bf16/fp16), keyed by parameter name; None otherwise."""
    if optimizer is None or not isinstance(getattr(booster, "plugin", None), MasterWeightShards):
        return None
    shards = booster.plugin.master_weight_shards(model, optimizer)
    # copies: shards may be views of one CPU buffer (Gemini's offloaded chunks), which safetensors refuses
    return None if shards is None else {k: v.detach().to("cpu", copy=True).contiguous() for k, v in shards.items()}


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
    newest_meta = read_meta(newest)
    if not newest_meta.get("finite", True):
        logger.warning("keep_last=%d: nothing pruned, %s holds non-finite weights", keep_last, newest)
        return
    ours = []
    for step, path in list_checkpoints(root, exp_name):
        if step >= newest_meta["step"]:
            continue
        try:
            if run_id is not None and read_meta(path).get("run_id") != run_id:
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
    if dist.is_initialized():
        device = collective_device()
    else:
        device = params[0].device if params else torch.device("cpu")
    bad = torch.zeros((), device=device)
    for p in params:  # Gemini may keep some on the CPU
        bad += (~torch.isfinite(p)).any().float().to(device)
    if dist.is_initialized() and global_world_size() > 1:
        dist.all_reduce(bad)
    return bad.item() == 0


def save_checkpoint(
    booster,
    ckpt_dir_root: str,
    step: int,
    model,
    optimizer,
    lr_scheduler=None,
    ema: Optional[EMAState] = None,
    extra_state: Optional[Dict[str, Any]] = None,
    keep_last: Optional[int] = None,
    exp_name: str = DEFAULT_EXP_NAME,
    run_id: Optional[str] = None,
) -> str:
    """Collective (every rank calls it): write ``<ckpt_dir_root>/<exp_name>_step<step>/`` atomically
    and return its path.

    ``model``/``optimizer``/``lr_scheduler`` are the objects ``booster.boost`` returned (optimizer and
    scheduler may be None); ``ema`` is the EMA to save (its ``state_dict(only_rank_0=True)`` is called
    on every rank, rank 0 writes the result), None when there is none. ``extra_state`` (epoch, sampler
    position, the config as a dict, ...) must be JSON-serialisable; :func:`load_checkpoint` returns it
    with ``step`` added. ``keep_last`` > 0 then deletes all but the newest ``keep_last`` complete
    checkpoints of ``exp_name`` (this one included), only older ones, only those saved with the same
    ``run_id`` when one is given, and nothing when this checkpoint's weights are not finite; None or 0
    keeps all. ZeRO's and Gemini's fp32 master shards are saved too (``master/rank<r>.safetensors``), so that a bf16
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
    rank = global_rank()
    final = os.path.join(ckpt_dir_root, checkpoint_name(exp_name, step))
    finite = all_finite(model)
    masters = _master_shards(booster, model, optimizer)

    problem = from_rank0(_room_problem(ckpt_dir_root, exp_name, step) if rank == 0 else None)
    if problem:
        raise StorageError(problem)
    try:
        _write(booster, final, step, model, optimizer, lr_scheduler, ema, extra, finite, masters, exp_name, run_id)
    except WriteFailed as e:  # the same on every rank; the paragraph adds what the run folder holds
        if e.kind == "storage":
            raise StorageError(_storage_paragraph(final, e.cause(global_world_size()), ckpt_dir_root, exp_name)) from e
        raise StorageError(f"saving {final!r} was abandoned: {e.cause(global_world_size())}, by another process "
                           f"or a clean-up of the folder. {_newest(ckpt_dir_root, exp_name).capitalize()}; rerun the "
                           f"same command with auto_resume=true to continue from it.") from e
    except CheckpointError:
        raise
    except Exception as e:  # outside the agreed steps (e.g. publishing): the storage's failure, if it is one
        reason = storage_failure(e)
        if reason is not None:
            raise StorageError(_storage_paragraph(final, reason, ckpt_dir_root, exp_name)) from e
        raise

    if keep_last and rank == 0:
        try:
            _prune(ckpt_dir_root, exp_name, keep_last, final, run_id)
        except (OSError, CheckpointError) as e:  # the new checkpoint is complete: a failed clean-up is not fatal
            logger.warning("keep_last=%d: could not remove an older checkpoint of %s (%s); it is kept", keep_last,
                           exp_name, e)
    barrier()
    return final


def _bytes_of(ckpt: str) -> int:
    return sum(record["size"] for record in read_meta(ckpt)["files"].values())


def _free_bytes(folder: str) -> int:
    while not os.path.isdir(folder):  # not created yet: the disk it will be on
        folder = os.path.dirname(os.path.abspath(folder))
    return shutil.disk_usage(folder).free


def _room_problem(root: str, exp_name: str, step: int) -> Optional[str]:
    """Why ``root`` lacks room for step ``step`` (free space below the newest checkpoint's size), else None."""
    found = list_checkpoints(root, exp_name)
    if not found:
        return None
    try:
        need = _bytes_of(found[-1][1])
    except CheckpointError:
        return None
    free = _free_bytes(root)
    if free >= need:
        return None
    return (f"no room to save step {step} in {root!r}: it has {free} bytes free and the previous checkpoint "
            f"{found[-1][1]} takes {need} bytes; nothing was written and every checkpoint is kept. Free at least "
            f"{need - free} bytes there (or set checkpoint_dir to a larger disk), then rerun the same command with "
            f"auto_resume=true to continue from step {found[-1][0]}.")


def _newest(root: str, exp_name: str) -> str:
    found = list_checkpoints(root, exp_name)
    return (f"every complete checkpoint is kept (the newest is step {found[-1][0]})" if found
            else "every complete checkpoint is kept (there is none yet)")


def _storage_paragraph(final: str, reason: str, root: str, exp_name: str) -> str:
    try:
        free = f"{_free_bytes(root)} bytes free"
    except OSError:
        free = "its free space unknown"
    return (f"saving {final!r} failed: {reason}. The partial folder was removed and {_newest(root, exp_name)}; "
            f"{root!r} has {free}. Free space, raise the quota or file-size limit, or set "
            f"checkpoint_dir to another disk, then rerun the same command with auto_resume=true.")


def _write(booster, final: str, step: int, model, optimizer, lr_scheduler, ema, extra, finite, masters,
           exp_name: str, run_id) -> None:
    """The collective write of one checkpoint folder, published atomically as ``final``. Each part is
    one agreed step of the partial copy (``files.PartialCopy``): a part that one rank cannot write
    ends the save on every rank with the same error, right after that part."""
    rank, world = global_rank(), global_world_size()
    with collective_write(final) as copy:
        tmp = copy.path
        copy.step("checkpoint folders", lambda: rank == 0 and _make_folders(tmp, masters is not None))
        copy.step("model", lambda: booster.save_model(model, os.path.join(tmp, MODEL_DIR), shard=True,
                                                      use_safetensors=True))
        if optimizer is not None:
            copy.step("optimizer state", lambda: booster.save_optimizer(optimizer, os.path.join(tmp, OPTIMIZER_DIR),
                                                                        shard=True))
        if lr_scheduler is not None:
            copy.step("LR scheduler", lambda: booster.save_lr_scheduler(lr_scheduler,
                                                                        os.path.join(tmp, LR_SCHEDULER_FILE)))
        if ema is not None:
            copy.step("EMA", lambda: _save_ema(ema, os.path.join(tmp, EMA_FILE), rank == 0))
        copy.step("RNG state", lambda: torch.save(get_rng_state(), os.path.join(tmp, RNG_DIR, f"rank{rank:05d}.pt")))
        if masters is not None:
            copy.step("fp32 master weights",
                      lambda: save_file(masters, os.path.join(tmp, MASTER_DIR, f"rank{rank:05d}.safetensors")))
        # Every rank's files are on disk (the steps agreed) before rank 0 lists them.
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
            "has_ema": ema is not None,
            "has_lr_scheduler": lr_scheduler is not None,
            "has_master_shards": masters is not None,
            "finite": finite,
            "run_id": run_id,
            "torch_version": torch.__version__,
            "extra_state": extra,
        }
        copy.step("metadata", lambda: rank == 0 and _write_meta(tmp, meta))


def _make_folders(tmp: str, masters: bool) -> None:
    """The partial folder and the sub-folders every rank writes a file of its own into."""
    os.makedirs(os.path.join(tmp, RNG_DIR))
    if masters:
        os.makedirs(os.path.join(tmp, MASTER_DIR))


def _save_ema(ema: EMAState, path: str, is_main: bool) -> None:
    state = ema.state_dict(only_rank_0=True)  # collective; only rank 0 holds the result
    if is_main:
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, path)


def _write_meta(tmp: str, meta: Dict[str, Any]) -> None:
    """``meta.json``, the completion marker, with the manifest of every file written (rank 0)."""
    meta = dict(meta, files=manifest(tmp))
    with open(os.path.join(tmp, META_FILE), "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


# --------------------------------------------------------------------------------------------------
# Load
# --------------------------------------------------------------------------------------------------

def _verified_meta(ckpt_dir: str, check_content: bool) -> Dict[str, Any]:
    """Rank 0 verifies; every rank gets the metadata or raises the same error (no rank hangs)."""
    result = None
    if global_rank() == 0:
        try:
            result = ("ok", verify_checkpoint(ckpt_dir, check_content))
        except (CheckpointError, OSError) as e:
            result = ("error", str(e))
    status, value = from_rank0(result)
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


def load_ema_file(ema: EMAState, path: str) -> None:
    """Load a full EMA state dict (safetensors, or a torch file read weights-only) into ``ema``."""
    if path.endswith(".safetensors"):
        try:
            state = load_file(path)
        except Exception as e:
            raise CheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    else:
        state = load_torch_file(path)
    with _loading("EMA", path):
        ema.load_state_dict(state)


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
    if not meta.get("has_master_shards") or not isinstance(getattr(booster, "plugin", None), MasterWeightShards):
        return
    if meta["world_size"] != global_world_size():
        if global_rank() == 0:
            logger.warning("%s: fp32 master weights were saved by %d ranks and cannot be split for %d; they are "
                           "rebuilt from the working weights", ckpt_dir, meta["world_size"], global_world_size())
        return
    path = os.path.join(ckpt_dir, MASTER_DIR, f"rank{global_rank():05d}.safetensors")
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
    ema: Optional[EMAState] = None,
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
    if ema is not None:
        path = os.path.join(ckpt_dir, EMA_FILE)
        if not meta["has_ema"]:
            raise CheckpointError(f"{path} does not exist: the checkpoint was saved without an EMA")
        load_ema_file(ema, path)
    if load_rng:
        if meta["world_size"] == global_world_size():
            set_rng_state(load_torch_file(os.path.join(ckpt_dir, RNG_DIR, f"rank{global_rank():05d}.pt")))
        elif global_rank() == 0:
            logger.warning(
                "%s was saved by %d ranks and is loaded by %d: RNG states are not restored "
                "(random streams continue from the current seeds)", ckpt_dir, meta["world_size"], global_world_size(),
            )
    return dict(meta["extra_state"], step=meta["step"])
