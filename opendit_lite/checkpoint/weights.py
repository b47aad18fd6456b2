"""Load model weights for sampling or ``init_from``, from any of the formats users have:

* a checkpoint folder written by train.py (``ema.safetensors`` and/or the sharded ``model/``);
* a ``model/`` folder or a single ``.safetensors`` file;
* LiteGen's model file ``<exp_name>_step<N>.pth`` (with ``use_ema``, its ``.ema.pth`` beside it
  replaces the trainable weights, as a checkpoint folder's EMA does);
* an original DiT ``.pt`` (a state dict, or ``{"model", "ema", ...}`` from DiT's train.py).

Nothing is unpickled beyond tensors (safetensors, or ``torch.load(weights_only=True)``).
"""

import json
import os
from typing import Dict, List

import torch
import torch.nn as nn
from safetensors.torch import load_file

from .catalog import EMA_FILE, MODEL_DIR
from .files import load_torch_file
from .layout import companion_path
from .original_dit import load_original_dit_checkpoint


def weights_folder(path: str) -> str:
    """The folder whose .safetensors files :func:`read_weights` reads for folder ``path``: its
    ``model/`` (a checkpoint folder), else ``path`` itself (a sharded weight folder)."""
    model_dir = os.path.join(path, MODEL_DIR)
    return model_dir if os.path.isdir(model_dir) else path


def weight_files(folder: str) -> List[str]:
    """The .safetensors files of ``folder``: those its ``*.safetensors.index.json`` names, else every
    one in it ([] when there are none)."""
    index = [f for f in os.listdir(folder) if f.endswith(".safetensors.index.json")]
    if index:
        with open(os.path.join(folder, index[0])) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))


def _read_sharded_safetensors(folder: str) -> Dict[str, torch.Tensor]:
    files = weight_files(folder)
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {folder!r}")
    state: Dict[str, torch.Tensor] = {}
    for name in files:
        path = os.path.join(folder, name)
        try:
            state.update(load_file(path))
        except Exception as e:
            raise ValueError(f"cannot read weights file {path!r} (truncated or corrupted?): {e}") from None
    return state


def read_weights(path: str, use_ema: bool = True) -> Dict[str, torch.Tensor]:
    """The state dict stored at ``path`` (see the module docstring for the accepted layouts)."""
    if os.path.isdir(path):
        state = _read_sharded_safetensors(weights_folder(path))
        ema = os.path.join(path, EMA_FILE)
        if use_ema and os.path.exists(ema):
            state.update(load_file(ema))  # the EMA covers the trainable weights; frozen ones come from model/
        return state
    if path.endswith(".safetensors") and os.path.exists(path):
        return load_file(path)
    raise FileNotFoundError(f"weights {path!r} do not exist (expected a checkpoint folder, "
                            f"a .safetensors file or an original DiT .pt)")


def load_weights(model: nn.Module, path: str, use_ema: bool = True) -> nn.Module:
    """Load ``path`` into ``model`` strictly (a mismatch names the missing/unexpected keys)."""
    ema = companion_path(path, "ema")
    if path.endswith(".pth") and use_ema and os.path.isfile(ema):  # LiteGen's files
        state = dict(load_torch_file(path))
        state.update(load_torch_file(ema))
        return load_original_dit_checkpoint(model, state)
    if not os.path.isdir(path) and not path.endswith(".safetensors"):
        return load_original_dit_checkpoint(model, path)  # .pt/.pth: reads it with weights_only=True
    state = read_weights(path, use_ema)
    dtype = next(model.parameters()).dtype
    return load_original_dit_checkpoint(model, {k: v.to(dtype) for k, v in state.items()})
