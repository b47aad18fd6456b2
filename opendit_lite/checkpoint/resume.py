"""Restoring a run from the checkpoint ``layout.pick_resume_checkpoint`` chose, shared by the
trainers (``training.state.restore_train_state``) and LiteGen: one function for both kinds of
checkpoint (a ``save_checkpoint`` folder, or LiteGen's model file with its companions) and for
where the EMA comes from.
"""

import logging
import os
from typing import Any, Dict, Optional

from ..errors import CheckpointError
from .catalog import EMA_FILE, is_checkpoint_dir
from .layout import companion_path, step_of
from .save_restore import EMAState, load_checkpoint, load_ema_file, load_model_weights, load_optimizer_state

logger = logging.getLogger(__name__)


def _restore_litegen_files(booster, model_path: str, model, optimizer, lr_scheduler) -> Dict[str, Any]:
    load_model_weights(booster, model, model_path)
    if optimizer is not None:
        optim_path = companion_path(model_path, "optimizer")
        if not os.path.exists(optim_path):
            raise CheckpointError(
                f"{optim_path} does not exist: resume_from={model_path} needs the optimizer state saved "
                f"next to it by save_optimizer (use init_from to load the weights only)"
            )
        load_optimizer_state(booster, optimizer, optim_path)
    if lr_scheduler is not None:
        logger.warning("%s holds no LR scheduler state; the scheduler restarts (save_checkpoint keeps it)", model_path)
    step = step_of(model_path)
    return {} if step is None else {"step": step}


def restore_run(booster, model, optimizer=None, lr_scheduler=None, *, ema: Optional[EMAState] = None,
                resume: Optional[str] = None, auto: bool = False,
                ema_resume_from: Optional[str] = None) -> Dict[str, Any]:
    """Collective: load ``resume`` (None: nothing) into the boosted ``model``, ``optimizer`` and
    ``lr_scheduler``, then into ``ema`` (the run's EMA, built once before this call) the first EMA
    source there is: ``ema_resume_from``, unless ``auto`` (``resume`` was found by auto_resume, so the
    EMA comes with it: a restarted job does not go back to the first launch's EMA); the EMA of a
    resumed checkpoint folder; the ``.ema.pth`` beside an auto-resumed LiteGen model file (an explicit
    LiteGen ``resume_from`` takes its EMA from ``ema.resume_from`` only, as LiteGen documents). A
    resumed run without an EMA source restarts the EMA from the resumed weights (with a warning).

    Returns the saved extra state with ``step`` ({} for a fresh start; a LiteGen file: its step).
    """
    state: Dict[str, Any] = {}
    ema_from = None if auto and resume else ema_resume_from
    if resume:
        if is_checkpoint_dir(resume):
            state = load_checkpoint(booster, resume, model, optimizer, lr_scheduler)
            folder_ema = os.path.join(resume, EMA_FILE)
            ema_from = ema_from or (folder_ema if os.path.isfile(folder_ema) else None)
        else:
            state = _restore_litegen_files(booster, resume, model, optimizer, lr_scheduler)
            file_ema = companion_path(resume, "ema")
            if auto and not ema_from and os.path.isfile(file_ema):
                ema_from = file_ema
    if ema is not None:
        if ema_from:
            load_ema_file(ema, ema_from)
        elif resume:
            ema.reset()  # equal to the weights just loaded
            logger.warning("no EMA to resume (set ema.resume_from): the EMA restarts from the resumed weights")
    return state
