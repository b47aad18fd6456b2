"""LoRA adapters in a family's original checkpoint layout (ComfyUI's), going out and coming in.

    export_original_lora(model, "out")    # out/comfyui_lora.safetensors: diffusion_model.<original layer>...
    tensors = to_original(spec, adapters, scale, widths)                   # the same, as tensors
    adapters = from_original(spec, tensors, rank, widths, adapted)         # back: layer -> (A, B, scale)

The names come from the family's ``original_lora`` piece (``families/original_lora_spec.py``,
``<family>/original_lora.py``): each original layer and the diffusers layers it holds, in the order
of its output rows. A plain rename carries the adapter as it is. A fused layer (Flux's ``qkv``)
holding m adapted parts of rank r gets one adapter of rank m r that computes the parts' updates
stacked: its down matrix is the parts' down matrices stacked, its up matrix block diagonal (part k's
up matrix in its own rows and in columns k r .. (k + 1) r; zero rows for a part without adapter), so
``up @ down`` is each part's ``B @ A`` in its rows and nothing is approximated. The scale is carried
as the family's loaders read it: ``alpha`` keys (``alpha = scale * m r``, so ``alpha / rank`` is the
trained ``lora_alpha / r``) in the "kohya" style, folded into the down matrix in the "peft" style.

Coming in, the inverse: a fused layer's adapter of rank m r whose up matrix is block diagonal splits
back into the parts' rank-r adapters exactly; one of rank r (a down matrix shared by the parts, as
some trainers write) gives each part that down matrix and its rows of the up matrix. Anything else
(another rank, a dense up matrix, rows for a layer the run does not adapt) is a ConfigError.
"""

import functools
import os
import re
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..errors import ConfigError
from .pretrained_files import make_readable

COMFYUI_WEIGHT_NAME = "comfyui_lora.safetensors"  # the original-layout file beside pytorch_lora_weights.safetensors
LORA_FORMATS = ("diffusers", "comfyui", "both")
# the two key styles' names of (down, up) and whether the scale is an alpha key
_STYLE = {"kohya": ("lora_down", "lora_up"), "kohya_dotted": ("lora.down", "lora.up"), "peft": ("lora_A", "lora_B")}

Adapter = Tuple[torch.Tensor, torch.Tensor, float]  # (A [r, in], B [out, r], scale): the update is scale * B @ A


@functools.lru_cache(maxsize=None)  # a layout's few templates, matched against every adapted layer
def _pattern(template: str) -> "re.Pattern":
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)"))


def original_layer(spec, name: str) -> Optional[Tuple[str, Tuple[str, ...]]]:
    """(the original layer holding the diffusers layer ``name``, the diffusers layers it holds in row
    order); None when the family's original layout does not name it."""
    for original, parts in spec.layers:
        for part in parts:
            match = _pattern(part).fullmatch(name)
            if match:
                index = match.groupdict().get("i")
                return original.format(i=index), tuple(p.format(i=index) for p in parts)
    return None


def diffusers_parts(spec, original: str) -> Optional[Tuple[str, ...]]:
    """The diffusers layers the original layer ``original`` holds, in row order; None if not a layer of the spec."""
    for template, parts in spec.layers:
        match = _pattern(template).fullmatch(original)
        if match:
            index = match.groupdict().get("i")
            return tuple(p.format(i=index) for p in parts)
    return None


def to_original(spec, adapters: Dict[str, Tuple[torch.Tensor, torch.Tensor]], scale: float,
                out_features: Dict[str, int]) -> Dict[str, torch.Tensor]:
    """The original-layout tensors of ``adapters`` (diffusers layer -> (A [r, in], B [out, r]), all of
    scale ``scale``). ``out_features``: the output width of every diffusers layer a fused original
    layer holds (its rows in the fused up matrix, adapted or not)."""
    unnamed = sorted(name for name in adapters if original_layer(spec, name) is None)
    if unnamed:
        raise ConfigError(f"the LoRA adapters of {unnamed[:4]} have no name in the family's original checkpoint layout "
                          f"(its original_lora piece maps the blocks' layers only), so a ComfyUI file cannot hold "
                          f"them: leave them out of lora.targets, or export lora_format: diffusers.")
    groups: Dict[str, Tuple[str, ...]] = {}
    for name in adapters:
        original, parts = original_layer(spec, name)
        groups[original] = parts
    down_key, up_key = _STYLE[spec.keys]
    out = {}
    for original, parts in sorted(groups.items()):
        present = [p for p in parts if p in adapters]
        downs = [adapters[p][0] for p in present]                                  # each [r, in]
        rank = downs[0].shape[0]
        down = torch.cat(downs, dim=0)                                             # [m r, in]
        widths = [adapters[p][1].shape[0] if p in adapters else out_features[p] for p in parts]
        up = downs[0].new_zeros(sum(widths), down.shape[0])                        # [sum out, m r]
        row = 0
        for part, width in zip(parts, widths):
            if part in adapters:
                k = present.index(part)
                up[row:row + width, k * rank:(k + 1) * rank] = adapters[part][1]   # part k's B in its block
            row += width
        key = spec.prefix + original
        if spec.keys != "peft":  # kohya's styles carry the scale as alpha
            out[f"{key}.alpha"] = torch.tensor(scale * down.shape[0], dtype=torch.float32)
        else:
            down = down * scale
        out[f"{key}.{down_key}.weight"] = down.contiguous()
        out[f"{key}.{up_key}.weight"] = up.contiguous()
    return out


def _original_tensors(spec, state: Dict[str, torch.Tensor]) -> Dict[str, Dict[str, torch.Tensor]]:
    """original layer -> {"down", "up", "alpha"} of an original-layout file's tensors (either key style)."""
    suffixes = {".lora_down.weight": "down", ".lora_up.weight": "up", ".lora.down.weight": "down",
                ".lora.up.weight": "up", ".lora_A.weight": "down", ".lora_B.weight": "up", ".alpha": "alpha"}
    layers: Dict[str, Dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        suffix = next((s for s in suffixes if key.endswith(s)), None)
        if not key.startswith(spec.prefix) or suffix is None:
            raise ConfigError(f"the LoRA file's key {key!r} is not a LoRA matrix or alpha under {spec.prefix!r} (DoRA "
                              f"scales, bias differences and other components cannot start a LoRA run here): give a "
                              f"plain LoRA file of the transformer.")
        layers.setdefault(key[len(spec.prefix):-len(suffix)], {})[suffixes[suffix]] = value
    return layers


def from_original(spec, state: Dict[str, torch.Tensor], rank: int,
                  out_features: Dict[str, int], adapted: Sequence[str]) -> Dict[str, Adapter]:
    """Diffusers layer -> (A [rank, in], B [out, rank], scale) of an original-layout file's tensors
    ``state``, split as the module docstring says. ``adapted``: the diffusers layers the run adapts
    (rank ``rank``); ``out_features``: the output width of every layer a fused original layer holds."""
    adapters: Dict[str, Adapter] = {}
    for original, tensors in sorted(_original_tensors(spec, state).items()):
        parts = diffusers_parts(spec, original)
        if parts is None or "down" not in tensors or "up" not in tensors:
            raise ConfigError(f"the LoRA file's layer {original!r} is not a layer of the family's original layout that "
                              f"holds adapted linear layers, or lacks its down or up matrix: give a LoRA file of this "
                              f"family's transformer.")
        present = [p for p in parts if p in adapted]
        if not present:
            raise ConfigError(f"the LoRA file adapts {list(parts)}, which this run's lora.targets do not adapt: add "
                              f"them to lora.targets.")
        down, up = tensors["down"].float(), tensors["up"].float()                 # [R, in], [sum out, R]
        scale = tensors["alpha"].item() / down.shape[0] if "alpha" in tensors else 1.0
        widths = [out_features[p] for p in parts]
        if up.shape[0] != sum(widths) or up.shape[1] != down.shape[0]:
            raise ConfigError(f"the LoRA file's {original!r} has up {tuple(up.shape)} and down {tuple(down.shape)}, "
                              f"which do not fit the model's layers {list(parts)} (output widths {widths}): give a "
                              f"LoRA file of this model's size.")
        rows = dict(zip(parts, torch.split(up, widths, dim=0)))                   # part -> [out, R]
        stray = [p for p in parts if p not in adapted and rows[p].abs().max() > 0]
        if stray:
            raise ConfigError(f"the LoRA file adapts {stray}, which this run's lora.targets do not adapt: add them to "
                              f"lora.targets.")
        total = down.shape[0]
        for k, part in enumerate(present):
            if total == rank * len(present):  # stacked parts: part k's own block
                block = slice(k * rank, (k + 1) * rank)
                outside = torch.cat([rows[part][:, :block.start], rows[part][:, block.stop:]], dim=1)
                if len(present) > 1 and outside.abs().max() > 0:
                    raise ConfigError(_rank_error(original, total, rank, len(present), dense=True))
                adapters[part] = (down[block], rows[part][:, block], scale)
            elif total == rank:  # one down matrix shared by the parts
                adapters[part] = (down, rows[part], scale)
            else:
                raise ConfigError(_rank_error(original, total, rank, len(present), dense=False))
    return adapters


def _rank_error(original: str, total: int, rank: int, parts: int, dense: bool) -> str:
    why = ("its up matrix is not block diagonal, so it is no sum of per-layer adapters" if dense else
           f"its rank {total} is neither lora.rank={rank} nor {parts} x {rank} (one block per adapted layer)")
    return (f"the LoRA file's {original!r} cannot be split into this run's rank-{rank} adapters: {why}. Set lora.rank "
            f"to the file's rank, or start from a LoRA file trained with it.")


def layer_widths(model: nn.Module, spec, names: Sequence[str]) -> Dict[str, int]:
    """The output width of every diffusers layer held by the original layers of ``names`` (modules of ``model``)."""
    widths = {}
    for name in names:
        found = original_layer(spec, name)
        for part in (found[1] if found else (name,)):
            try:
                widths[part] = model.get_submodule(part).out_features
            except AttributeError:
                raise ConfigError(f"the model has no linear layer {part!r}, which the original layout fuses with "
                                  f"{name!r}; export lora_format: diffusers.") from None
    return widths


def export_original_lora(model: nn.Module, output: str, *, state: Optional[Dict[str, torch.Tensor]] = None) -> str:
    """Write the LoRA adapters of ``model`` (a family's diffusers transformer with peft adapters, as
    trained) under the family's original checkpoint names as ``<output>/comfyui_lora.safetensors``;
    returns ``output``. ``state``: the weights to take the adapters from (the EMA's; None: the model's)."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    from ..families import family_of
    from .diffusers_export import ADAPTER, diffusers_class, plain_state

    plain, state = plain_state(model, state)
    config = getattr(plain, "peft_config", {}).get(ADAPTER)
    if config is None:
        raise ConfigError(f"{type(plain).__name__} has no LoRA adapters to export (lora.rank 0 trains every weight): "
                          f"export the whole model instead.")
    spec = require_original_layout(family_of(diffusers_class(plain)), diffusers_class(plain).__name__)
    peft_state = get_peft_model_state_dict(plain, state_dict=state, adapter_name=ADAPTER)
    layers = sorted({k.rsplit(".lora_", 1)[0] for k in peft_state})
    adapters = {n: (peft_state[f"{n}.lora_A.weight"], peft_state[f"{n}.lora_B.weight"]) for n in layers}
    tensors = to_original(spec, adapters, config.lora_alpha / config.r, layer_widths(plain, spec, layers))
    os.makedirs(output, exist_ok=True)
    # sd-scripts' metadata names, which LoRA tools show: the trained rank and alpha
    save_file(tensors, os.path.join(output, COMFYUI_WEIGHT_NAME),
              metadata={"ss_network_dim": str(config.r), "ss_network_alpha": str(config.lora_alpha)})
    return make_readable(output)


def require_original_layout(family, class_name: str):
    """The family's original-layout piece; a ConfigError naming the family when it has none."""
    spec = getattr(family, "original_lora", None)
    if spec is None:
        name = family.name if family is not None else class_name
        raise ConfigError(f"the {name} family declares no original checkpoint layout for LoRA files (no "
                          f"families/{name}/original_lora.py), so there is no ComfyUI format to write or read for "
                          f"{class_name}: use export.lora_format: diffusers (its pipeline's LoRA file), or a LoRA file "
                          f"in the diffusers format.")
    return spec
