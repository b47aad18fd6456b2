"""LoRA fine-tuning with peft: adapters on chosen linear layers, a frozen base, and merging back.

``apply_lora`` injects peft's LoRA layers into the model in place (the model keeps its class and
forward signature, so the plugin, the converters and the samplers see the same model), freezes
every other weight and returns a report of what is trained. The optimizer then receives only the
adapters, so DDP all-reduces, ZeRO shards, and the sharded EMA averages only them; a checkpoint
still holds the whole model (base weights under ``<layer>.base_layer.*``, adapters under
``<layer>.lora_A/B.default.*``).

``merge_lora`` folds each adapter into its base weight, ``W + (alpha / rank) B A``, and puts the
plain ``nn.Linear`` back: the result has the original model's keys and computes what the adapted
model computes. Reading a checkpoint into an adapted model and merging it (``load_merged``), and
writing the merged weights as one ``.safetensors`` file (``export_merged``), are in
``opendit_lite.builders.lora_checkpoint``.

    model = build_model_from_config(cfg)
    load_weights(model, "pretrained.pt")
    print(apply_lora(model, rank=8, alpha=16, dropout=0.0, targets=None))   # None: the model's usual targets
    ...  # train; the checkpoint holds base and adapters
    export_merged(build_model_from_config(cfg), checkpoint, "merged.safetensors", use_ema=True, lora=to_dict(cfg.lora))
"""

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch.nn as nn

from ..errors import ConfigError
from .capabilities import lora_targets
from .experts import NoiseExperts


def lora_target_names(model: nn.Module, targets: Sequence[str]) -> List[str]:
    """Full names of the ``nn.Linear`` layers matched by ``targets``.

    A target matches a layer whose name is the target or ends with ``.<target>`` (``proj`` matches
    ``blocks.3.attn.proj``, ``attn.proj`` only attention's), or, failing that, whose full name the
    target matches as a regular expression (``blocks\\.(0|1)\\..*qkv``). Only linear layers are
    adapted, so ``proj`` does not catch the convolutional patch embedding ``x_embedder.proj``."""
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        for target in targets:
            if name == target or name.endswith("." + target) or re.fullmatch(target, name):
                names.append(name)
                break
    return names


@dataclass
class LoRAReport:
    layers: int
    trainable: int
    total: int
    targets: Sequence[str] = ()

    def __str__(self) -> str:
        # AdamW keeps 2 fp32 moments per trained value, plus its gradient: the memory full training
        # would need for every weight is paid here for the adapters only.
        state_mib = self.trainable * (4 + 4 + 4) / 2**20
        full_mib = self.total * (4 + 4 + 4) / 2**20
        return (f"LoRA on {self.layers} linear layers: {self.trainable / 1e6:.3f}M trainable of "
                f"{self.total / 1e6:.2f}M parameters ({100 * self.trainable / max(self.total, 1):.2f}%); "
                f"gradients + AdamW state {state_mib:.1f} MiB instead of {full_mib:.1f} MiB for full training")


def apply_lora(model: nn.Module, *, rank: int, alpha: float, dropout: float,
               targets: Optional[Sequence[str]] = None, adapter_name: str = "default") -> LoRAReport:
    """Add rank-``rank`` adapters (scale ``alpha / rank``, input dropout ``dropout``) to the linear
    layers named by ``targets`` and freeze everything else, in place. ``targets`` None: the model's
    declared ``lora_targets`` (the zoo's ``qkv``/``proj``/``fc1``/``fc2``; for a diffusers family
    the layers diffusers' LoRA scripts adapt, declared in ``opendit_lite/families/<family>/``). A
    ConfigError says so when no linear layer matches. Adapters start as an exact no-op (peft initialises B to zero).
    ``NoiseExperts`` (two experts) gets adapters on each expert, as if each were the model. ``adapter_name``:
    peft's name of the adapter (its keys ``lora_A.<adapter_name>``; distillation adds two)."""
    from peft import LoraConfig, inject_adapter_in_model

    if isinstance(model, NoiseExperts):
        reports = [apply_lora(expert, rank=rank, alpha=alpha, dropout=dropout, targets=targets,
                              adapter_name=adapter_name)
                   for _, expert in model.experts()]
        return LoRAReport(layers=sum(r.layers for r in reports), trainable=sum(r.trainable for r in reports),
                          total=sum(r.total for r in reports), targets=reports[0].targets)

    targets = lora_targets(model) if targets is None else tuple(targets)
    names = lora_target_names(model, targets)
    if not names:
        linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        raise ConfigError(f"'lora.targets' {list(targets)} match no linear layer of {type(model).__name__}; "
                         f"its linear layers include {linear[:8]}")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=names, bias="none")
    inject_adapter_in_model(config, model, adapter_name=adapter_name)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return LoRAReport(layers=len(names), trainable=sum(p.numel() for p in trainable),
                      total=sum(p.numel() for p in model.parameters()), targets=targets)


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base layer and put the plain base layer back, in place.

    The merged model has the keys of the model before ``apply_lora``; all its parameters are
    trainable again (as a freshly built model's)."""
    from peft.tuners.lora import LoraLayer

    adapted = [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]
    for name, module in adapted:
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
    for p in model.parameters():
        p.requires_grad_(True)
    return model
