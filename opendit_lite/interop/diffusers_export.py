"""The diffusers transformers trained here (Wan, Flux, SD3, CogVideoX, HunyuanVideo, LTX-Video) back
to the files their own class and pipeline load unchanged.

    export_family(model, "out/transformer")                        # the model's own weights, LoRA merged
    export_family(model, "out/transformer", state=ema_state)      # the EMA's weights instead
    export_lora(model, "out/lora")                                 # the LoRA adapters alone (no base weights)

    transformer = WanTransformer3DModel.from_pretrained("out/transformer")
    pipe = WanPipeline.from_pretrained("<the pipeline trained from>"); pipe.load_lora_weights("out/lora")

What training changed and the export undoes or ignores: the converter's fused AdaLN rebinds the
class of blocks and norms in place (``class_swap``) and sequence parallelism swaps attention
processors and adds hooks; activation checkpointing and per-block compile wrap forwards. None of
them renames a weight, so the trained model's state dict has diffusers' keys. The export therefore
builds a fresh instance of the original diffusers class from the model's own ``config`` (on the
meta device: nothing is allocated twice), assigns the weights to it and calls ``save_pretrained``.
Every file gets the mode of the config (``files.make_readable``), not the 0600 of diffusers' weights.
Keys of wrappers around the whole model (DDP's and Colossal-AI's ``module.``, ``torch.compile``'s
``_orig_mod.``, torch's checkpoint wrapper) are dropped first.

LoRA (peft adapters on the trained model, ``models/lora.py``): ``export_family`` folds each adapter
into its base weight, ``W + scaling * B @ A`` with the adapter's own scaling (alpha / rank), so the
folder holds the plain model computing what the adapted one computes (a whole copy of the model).
``export_lora`` writes only the adapters, ``pytorch_lora_weights.safetensors``, through the family
pipeline's own ``save_lora_weights`` (peft's ``get_peft_model_state_dict`` picks the adapters out of
the state dict; the adapter's ``LoraConfig`` goes into the file's metadata, so rank, alpha and the
adapted layers load as trained): ``<Family>Pipeline.load_lora_weights(folder)`` reads it into the
pipeline's ``transformer`` (Wan 2.2's second expert: ``load_lora_weights(folder,
load_into_transformer_2=True)``), and ``transformer.load_lora_adapter(folder,
weight_name=LORA_WEIGHT_NAME)`` into a transformer alone. A pipeline class without LoRA loading
(HunyuanVideo 1.5's) gets the same file, written by diffusers' shared LoRA writer; its
``pipe.transformer.load_lora_adapter(folder, weight_name=LORA_WEIGHT_NAME)`` reads it.
"""

import os
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

from ..errors import ConfigError
from .pretrained_files import LORA_WEIGHT_NAME, make_readable

LORA_MODES = ("merged", "adapter")  # a LoRA run's export: the adapters merged into a full model, or alone
ADAPTER = "default"  # the adapter name peft gives apply_lora's adapters
# Path segments that wrappers of the whole model add to every key.
WRAPPER_SEGMENTS = ("_orig_mod.", "_checkpoint_wrapped_module.")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The diffusers model inside ``model``: through ``torch.compile``'s ``_orig_mod`` and any
    wrapper holding it as ``.module`` (DDP, Colossal-AI's ``ModelWrapper``)."""
    # torch.compile's wrapper forwards attribute reads (``config`` too) to the module it wraps.
    while isinstance(getattr(model, "_orig_mod", None), nn.Module) or not hasattr(model, "config"):
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            raise ConfigError(f"{type(model).__name__} holds no diffusers model (no 'config'); only diffusers "
                              f"transformers export with export_family (our DiT: interop.to_diffusers_dit).")
        model = inner
    return model


def diffusers_class(model: nn.Module) -> type:
    """The diffusers class ``model`` was built as (its class before any ``class_swap``)."""
    cls = getattr(type(model), "_original_class", type(model))
    if not cls.__module__.startswith("diffusers.") or not hasattr(cls, "save_pretrained"):
        raise ConfigError(f"{cls.__name__} is not a diffusers model class; only diffusers transformers export "
                          f"with export_family (our DiT: interop.to_diffusers_dit).")
    return cls


def _plain_key(key: str, has_module_child: bool) -> str:
    for segment in WRAPPER_SEGMENTS:
        key = key.replace(segment, "")
    if key.startswith("module.") and not has_module_child:
        key = key[len("module."):]
    return key


def lora_scalings(model: nn.Module) -> Dict[str, float]:
    """Layer name -> the scaling of its adapter, for every peft LoRA layer of ``model``."""
    from peft.tuners.lora import LoraLayer

    return {name: module.scaling[ADAPTER] for name, module in model.named_modules()
            if isinstance(module, LoraLayer) and ADAPTER in module.scaling}


def split_lora_state(state: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """(base weights under the plain model's keys, adapters under peft's saved keys
    ``<layer>.lora_A.weight``) of an adapted model's state dict."""
    base, adapters = {}, {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            adapters[key.replace(f".{ADAPTER}.", ".")] = value
        else:
            base[key.replace(".base_layer.", ".")] = value
    return base, adapters


def merge_lora_state(base: Dict[str, torch.Tensor], adapters: Dict[str, torch.Tensor],
                     scalings: Dict[str, float]) -> Dict[str, torch.Tensor]:
    """``base`` with each adapted linear weight replaced by ``W + scaling * B @ A`` (in fp32, then
    the base weight's dtype)."""
    merged = dict(base)
    for layer, scaling in scalings.items():
        a, b = adapters[f"{layer}.lora_A.weight"], adapters[f"{layer}.lora_B.weight"]    # [r, in], [out, r]
        weight = base[f"{layer}.weight"]                                                  # [out, in]
        merged[f"{layer}.weight"] = (weight.float() + scaling * (b.float() @ a.float())).to(weight.dtype)
    return merged


def plain_state(model: nn.Module, state: Optional[Dict[str, torch.Tensor]] = None
                ) -> Tuple[nn.Module, Dict[str, torch.Tensor]]:
    """(the diffusers model inside ``model``, ``state`` or its own state dict with the wrappers' key
    segments dropped, on the CPU)."""
    plain = unwrap_model(model)
    source = plain.state_dict() if state is None else state
    has_module_child = any(name == "module" for name, _ in plain.named_children())
    return plain, {_plain_key(k, has_module_child): v.detach().cpu() for k, v in source.items()}


def export_family(model: nn.Module, output: str, *, state: Optional[Dict[str, torch.Tensor]] = None,
                  lora: str = "merged") -> str:
    """Write the diffusers transformer ``model`` (as trained: converted, parallelised, wrapped) to the
    folder ``output`` with ``save_pretrained``; returns ``output``.

    ``state``: the weights to write, a state dict of the model (e.g. its EMA's ``state_dict()``;
    None: the model's own). ``lora``: "merged" (adapters folded in) or "adapter" (the adapters alone,
    ``export_lora``); ignored by a model without adapters."""
    if lora not in LORA_MODES:
        raise ConfigError(f"lora={lora!r} is not an export mode; use one of {', '.join(LORA_MODES)}.")
    plain, state = plain_state(model, state)
    base, adapters = split_lora_state(state)
    if adapters and lora == "adapter":
        return export_lora(model, output, state=state)
    cls = diffusers_class(plain)
    scalings = lora_scalings(plain) if adapters else {}
    if adapters and not scalings:
        raise ConfigError("these weights hold LoRA adapters but the model has none to read their scaling from; "
                          "add the run's adapters to the model (apply_lora with its lora section) before exporting.")
    if adapters:
        base = merge_lora_state(base, adapters, scalings)
    with torch.device("meta"):  # the weights are assigned below: allocate nothing here
        fresh = cls.from_config(dict(plain.config))
    missing, unexpected = fresh.load_state_dict(base, strict=False, assign=True)
    if missing or unexpected:
        raise ConfigError(f"these weights do not fit a fresh {cls.__name__} built from the model's config: missing "
                          f"{missing[:5]}, unexpected {unexpected[:5]}; export the model they were trained with.")
    fresh.save_pretrained(output, safe_serialization=True)
    return make_readable(output)


def pipeline_loads_lora(pipeline_class: str) -> bool:
    """Whether the diffusers pipeline class ``pipeline_class`` saves and loads LoRA files itself
    (``save_lora_weights`` / ``load_lora_weights``); HunyuanVideo 1.5's pipelines in diffusers 0.42 do not:
    their transformer's ``load_lora_adapter`` reads the file."""
    import diffusers

    return hasattr(getattr(diffusers, pipeline_class, None), "load_lora_weights")


def export_lora(model: nn.Module, output: str, *, state: Optional[Dict[str, torch.Tensor]] = None) -> str:
    """Write the LoRA adapters of ``model`` (a diffusers transformer with peft adapters, as trained),
    and nothing else, as ``<output>/pytorch_lora_weights.safetensors`` with ``save_lora_weights`` of
    its family's pipeline class (``Family.pipeline``); returns ``output``.
    ``state``: the weights to take the adapters from (the EMA's; None: the model's own)."""
    import diffusers
    from peft.utils import get_peft_model_state_dict

    from ..families import family_of

    plain, state = plain_state(model, state)
    if ADAPTER not in getattr(plain, "peft_config", {}):
        raise ConfigError(f"{type(plain).__name__} has no LoRA adapters to export (lora.rank 0 trains every weight): "
                          f"export the whole model (export_family) instead.")
    family = family_of(diffusers_class(plain))
    if family is None:
        raise ConfigError(f"{diffusers_class(plain).__name__} is not the transformer of a registered family, so no "
                          f"pipeline's LoRA format is known for it; export the whole model (export_family) instead.")
    adapters = get_peft_model_state_dict(plain, state_dict=state, adapter_name=ADAPTER)
    if not adapters:
        raise ConfigError("the weights given hold none of the model's LoRA adapters (no lora_A / lora_B entries): "
                          "export the checkpoint of the LoRA run itself.")
    os.makedirs(output, exist_ok=True)
    layers, metadata = {k: v.contiguous() for k, v in adapters.items()}, plain.peft_config[ADAPTER].to_dict()
    if pipeline_loads_lora(family.pipeline):
        getattr(diffusers, family.pipeline).save_lora_weights(output, transformer_lora_layers=layers,
                                         transformer_lora_adapter_metadata=metadata, weight_name=LORA_WEIGHT_NAME)
    else:  # a pipeline without LoRA loading (HunyuanVideo 1.5's in diffusers 0.42): the file every pipeline's
        # save_lora_weights writes (keys and metadata under "transformer."), which transformer.load_lora_adapter reads
        from diffusers.loaders.lora_base import LoraBaseMixin

        LoraBaseMixin._save_lora_weights(output, {"transformer": layers}, {"transformer": metadata},
                                         weight_name=LORA_WEIGHT_NAME)
    return make_readable(output)
