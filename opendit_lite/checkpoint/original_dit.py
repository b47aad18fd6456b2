"""Load facebookresearch/DiT checkpoints into ``opendit_lite.models.DiT``.

Two layouts exist: the released pretrained files (e.g. ``DiT-XL-2-256x256.pt``) are a plain state
dict, while the reference ``train.py`` saves ``{"model", "ema", "opt", "args"}``, where ``args`` is
an ``argparse.Namespace``. For the latter the EMA weights are taken, as the reference sampler does,
because they are the ones that give the published sample quality. Our DiT uses the same parameter
names, so the weights load with ``strict=True`` and no renaming; anything else is a configuration
mismatch and is reported key by key.
"""

import argparse
import os
from typing import Dict, List, Mapping, Union

import torch
import torch.nn as nn

from ..errors import ConfigError
from .files import load_torch_file

StateDict = Mapping[str, torch.Tensor]


def _read_checkpoint(path_or_state_dict: Union[str, os.PathLike, Mapping]) -> Mapping:
    if isinstance(path_or_state_dict, Mapping):
        return path_or_state_dict
    # weights_only refuses arbitrary pickled code; the only non-tensor object the reference
    # training script stores is its argparse.Namespace, which is allowed explicitly.
    return load_torch_file(os.fspath(path_or_state_dict), allowed=[argparse.Namespace])


def _select_weights(checkpoint: Mapping) -> StateDict:
    """The EMA weights of a training checkpoint, its ``model`` weights if it has no EMA, else itself."""
    for key in ("ema", "model"):
        if key in checkpoint:
            return checkpoint[key]
    return checkpoint


def _describe(keys: List[str], limit: int = 10) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def _check_compatible(model: nn.Module, state_dict: StateDict) -> None:
    """Raise one error listing every missing, unexpected and wrongly shaped key."""
    expected: Dict[str, torch.Tensor] = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mismatched = [
        f"{k} (checkpoint {list(state_dict[k].shape)}, model {list(expected[k].shape)})"
        for k in expected
        if k in state_dict and tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_describe(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {_describe(mismatched)}")
    if problems:
        raise ConfigError(
            f"checkpoint does not match {type(model).__name__}: " + "; ".join(problems) + ". "
            "Build the model with the checkpoint's configuration (e.g. DiT-XL/2 vs DiT-XL/4, "
            "input_size = image_size // 8, learn_sigma, num_classes, class_dropout_prob > 0)."
        )


def load_original_dit_checkpoint(model: nn.Module,
                                 path_or_state_dict: Union[str, os.PathLike, Mapping]) -> nn.Module:
    """Load a reference DiT checkpoint (a path or an already loaded dict) into ``model``, strictly.

    Accepts a plain state dict or a training checkpoint with ``"ema"``/``"model"`` entries (EMA
    preferred). Raises ``ConfigError`` (a ``ValueError``) naming the missing, unexpected and wrongly shaped keys when
    the checkpoint was made for a different configuration. Returns ``model``.
    """
    state_dict = _select_weights(_read_checkpoint(path_or_state_dict))
    _check_compatible(model, state_dict)
    model.load_state_dict(state_dict, strict=True)
    return model
