"""A LoRA file as the start of a LoRA run (``lora.init_from``): its adapters copied into the
adapters ``apply_lora`` put on a family's transformer, to continue training them.

    check_lora_file("out/diffusers", "FluxTransformer2DModel")    # before anything is built: the format
    print(load_lora_file(model, "out/diffusers"))                   # after apply_lora (parallelize)

Two formats, told apart by their keys: the diffusers format (``transformer.<layer>.lora_A.weight``,
what ``save_lora_weights`` and ``export.lora_format: diffusers`` write; the scale ``lora_alpha / r``
from the file's ``lora_adapter_metadata``, else 1 as diffusers' loaders assume), and the family's
original layout (``diffusion_model.<original layer>...``, ComfyUI's and ``export.lora_format:
comfyui``'s, split back per layer by ``original_lora.from_original``). A folder means the file in it:
``pytorch_lora_weights.safetensors``, else ``comfyui_lora.safetensors``.

Each file adapter's update ``scale_file * B @ A`` is kept: the run's adapter gets ``B`` and
``A * scale_file / scale_run`` (``scale_run`` its ``lora_alpha / r``), so an adapter exported from a
run with the same rank and alpha comes back with its own weights. The file's rank must be the run's
``lora.rank``; a layer the file adapts must be adapted by the run (its ``lora.targets``); a layer the
run adapts and the file does not keeps its fresh adapter (an exact no-op), and the report says how many.
"""

import json
import os
from typing import Dict, Tuple

import torch
import torch.nn as nn

from ..errors import ConfigError
from .comfyui_lora import COMFYUI_WEIGHT_NAME, Adapter, from_original, layer_widths, require_original_layout
from .diffusers_export import WRAPPER_SEGMENTS
from .pretrained_files import LORA_WEIGHT_NAME

DIFFUSERS_PREFIX = "transformer."
LORA_MATRICES = (".lora_A.weight", ".lora_B.weight")


def lora_file(path: str) -> str:
    """The LoRA file ``path`` names: itself, or in a folder its diffusers file, else its ComfyUI file."""
    if os.path.isdir(path):
        for name in (LORA_WEIGHT_NAME, COMFYUI_WEIGHT_NAME):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        raise ConfigError(f"lora.init_from {path!r} is a folder without {LORA_WEIGHT_NAME} or {COMFYUI_WEIGHT_NAME}: "
                          f"point it at a LoRA .safetensors file or at the diffusers/ folder a LoRA run exported.")
    if not os.path.isfile(path) or not path.endswith(".safetensors"):
        raise ConfigError(f"lora.init_from {path!r} is not a .safetensors file or a folder holding one: point it at a "
                          f"LoRA file (diffusers or ComfyUI format).")
    return path


def _read(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"lora.init_from {path!r} cannot be read as safetensors ({e}): give an intact LoRA file.") \
            from None


def file_format(keys, spec) -> str:
    """"diffusers" or "comfyui" by the file's keys; a ConfigError for anything else."""
    keys = list(keys)
    if keys and spec is not None and all(k.startswith(spec.prefix) for k in keys):
        return "comfyui"
    if keys and all(k.startswith(DIFFUSERS_PREFIX) and k.endswith(LORA_MATRICES) for k in keys):
        return "diffusers"  # only the two matrices: a DoRA magnitude or a bias would be dropped
    original = f"or the family's original layout ({spec.prefix}...) " if spec is not None else ""
    raise ConfigError(f"lora.init_from holds keys such as {keys[:3]}, which are neither the diffusers LoRA format of a "
                      f"transformer (transformer.<layer>.lora_A.weight) {original}(text-encoder adapters, other "
                      f"trainers' layouts and DoRA files are not read): convert it to one of those formats first.")


def check_lora_file(path: str, class_name: str) -> str:
    """The format of the LoRA file ``path`` names for a run of the family class ``class_name``
    (header only); a ConfigError when it cannot start that run."""
    from safetensors import SafetensorError, safe_open

    from ..families import family_of

    family = family_of(class_name)
    if family is None:
        raise ConfigError(f"lora.init_from reads a diffusers family's LoRA file, but {class_name} is not a diffusers "
                          f"family: start from weights with init_from instead.")
    path = lora_file(path)
    try:
        with safe_open(path, "pt") as f:
            keys = list(f.keys())
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"lora.init_from {path!r} cannot be read as safetensors ({e}): give an intact LoRA file.") \
            from None
    return file_format(keys, family.original_lora)


def read_lora_file(path: str, model: nn.Module, rank: int, adapted) -> Dict[str, Adapter]:
    """Diffusers layer -> (A, B, scale) of the LoRA file ``path`` names, for the family transformer
    ``model`` whose adapted layers are ``adapted``."""
    from ..families import family_of
    from .diffusers_export import diffusers_class

    cls = diffusers_class(model)
    spec = getattr(family_of(cls), "original_lora", None)
    state, metadata = _read(lora_file(path))
    if file_format(state, spec) == "comfyui":
        spec = require_original_layout(family_of(cls), cls.__name__)
        return from_original(spec, state, rank, layer_widths(model, spec, adapted), adapted)
    config = json.loads(metadata.get("lora_adapter_metadata", "{}"))
    patterns = [k for k in ("transformer.rank_pattern", "transformer.alpha_pattern") if config.get(k)]
    if patterns:
        raise ConfigError(f"the LoRA file's metadata sets {' and '.join(patterns)} (per-layer ranks or scales), which "
                          f"lora.init_from does not read: it would start the adapters at the wrong scale. Start from a "
                          f"LoRA of one rank and alpha.")
    scale = config["transformer.lora_alpha"] / config["transformer.r"] if "transformer.r" in config else 1.0
    layers = sorted({k[len(DIFFUSERS_PREFIX):].rsplit(".lora_", 1)[0] for k in state})
    adapters = {}
    for name in layers:
        key = DIFFUSERS_PREFIX + name
        a, b = state.get(f"{key}.lora_A.weight"), state.get(f"{key}.lora_B.weight")
        if a is None or b is None:
            raise ConfigError(f"the LoRA file has only one of {name}'s two matrices (lora_A, lora_B): give a complete "
                              f"LoRA file.")
        adapters[name] = (a.float(), b.float(), scale)
    return adapters


def _plain_name(name: str) -> str:
    for segment in WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def load_lora_file(model: nn.Module, path: str, adapter: str = "default") -> str:
    """Copy the adapters of the LoRA file ``path`` names into the peft adapters of ``model`` (a family
    transformer after ``apply_lora``, possibly converted and wrapped); returns a one-line report."""
    from peft.tuners.lora import LoraLayer

    from .diffusers_export import unwrap_model

    plain = unwrap_model(model)
    layers = {_plain_name(n): m for n, m in plain.named_modules()
              if isinstance(m, LoraLayer) and adapter in m.lora_A}
    if not layers:
        raise ConfigError("lora.init_from needs LoRA adapters on the model (lora.rank > 0).")
    rank = next(iter(layers.values())).r[adapter]
    adapters = read_lora_file(path, plain, rank, sorted(layers))
    stray = sorted(set(adapters) - set(layers))
    if stray:
        raise ConfigError(f"the LoRA file adapts {stray[:4]} ({len(stray)} layers), which this run's lora.targets do "
                          f"not adapt: add them to lora.targets (or start from a file of the same targets).")
    with torch.no_grad():
        for name, (a, b, scale) in adapters.items():
            layer = layers[name]
            own_a, own_b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            if a.shape != own_a.shape or b.shape != own_b.shape:
                raise ConfigError(f"the LoRA file's {name} has A {tuple(a.shape)} and B {tuple(b.shape)}, but the "
                                  f"run's adapter has {tuple(own_a.shape)} and {tuple(own_b.shape)}: set lora.rank to "
                                  f"the file's rank ({a.shape[0]}), on the model the file was trained for.")
            ratio = scale / layer.scaling[adapter]
            own_a.copy_(a if ratio == 1.0 else a * ratio)
            own_b.copy_(b)
    return (f"lora.init_from: {len(adapters)} of the model's {len(layers)} adapted layers from {lora_file(path)}"
            + ("" if len(adapters) == len(layers) else " (the others start as no-ops)"))
