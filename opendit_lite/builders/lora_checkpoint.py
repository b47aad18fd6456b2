"""LoRA runs' checkpoints: loading one into a freshly built base model with its adapters merged
(the samplers call ``load_merged`` for every checkpoint), and writing the merged weights as one
``.safetensors`` file (``export_merged``, at the end of a LoRA run) that ``sample.ckpt`` and
``init_from`` load. The adapters themselves are ``opendit_lite.models.lora``.
"""

from typing import Optional

import torch.nn as nn

from ..checkpoint.weights import load_weights
from ..models.lora import apply_lora, merge_lora


def load_merged(model: nn.Module, path: str, *, use_ema: bool, lora: Optional[dict]) -> nn.Module:
    """Load checkpoint ``path`` into a freshly built base ``model``; when ``lora`` (the run's saved
    ``lora`` section, ``rank`` > 0) says the run trained adapters, add them first and merge them after.
    Samplers call this for every checkpoint; without adapters it is ``load_weights``."""
    if not lora or not lora.get("rank"):
        return load_weights(model, path, use_ema=use_ema)
    apply_lora(model, rank=lora["rank"], alpha=lora["alpha"], dropout=lora["dropout"], targets=lora["targets"])
    load_weights(model, path, use_ema=use_ema)
    return merge_lora(model)


def export_merged(model: nn.Module, checkpoint: str, out: str, *, use_ema: bool, lora: dict) -> str:
    """Write ``checkpoint``'s merged weights (the EMA where kept and ``use_ema``) to the
    ``.safetensors`` file ``out``, for a freshly built base ``model``; returns ``out``."""
    from safetensors.torch import save_file

    load_merged(model, checkpoint, use_ema=use_ema, lora=lora)
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, out)
    return out
