"""Frozen base weights in low precision for LoRA runs (``lora.base_precision: fp8 | nf4``).

    report = apply_base_precision(model, "fp8")   # after apply_lora: the adapters stay as they are
    print(report)                                  # how many layers, bytes before and after

Every frozen ``nn.Linear`` inside the model's repeated blocks (peft's ``base_layer`` of an adapted
layer, and frozen linear layers without adapters) becomes a ``LowPrecisionLinear`` that stores its
weight in

* ``fp8``: float8 e4m3 with one fp32 scale per output row (``amax(|row|) / 448``, 448 being e4m3's
  largest value), 1 byte per weight. A per-row scale keeps small weights out of e4m3's subnormal
  range, where a plain cast (no scale) keeps 1-3 significant bits.
* ``nf4``: bitsandbytes' 4-bit NormalFloat (QLoRA), blocks of 64 weights with an fp32 absmax each,
  0.5 + 1/16 bytes per weight; ``bitsandbytes.functional.quantize_4bit`` / ``dequantize_4bit``.

and computes in the activations' dtype (bf16 in a bf16 run): the weight is dequantized for the
matmul, and again in backward for the input gradient. Adapters, biases, norms, embedders and the
final layer keep the run's precision; the adapters' gradients see the dequantized base.

Why our own layer rather than torchao's ``Float8WeightOnlyConfig`` or diffusers'
``apply_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)``: both
train correctly with peft adapters (checked on the CPU: equal input and adapter gradients against a
reference with the dequantized weights), but both leave autograd holding a bf16 copy of every weight
until backward (torchao saves the dequantized weight for the input gradient; layerwise casting's
post-forward cast back to FP8 repoints the parameter while the matmul's saved view keeps the bf16
storage). In a block that is not checkpointed the run would then hold FP8 *and* bf16 weights at its
peak, more than bf16 alone. ``LowPrecisionLinear``'s autograd function saves the stored low-precision
tensor itself (which block swapping also recognises, so a swapped block keeps nothing on the device
between its forward and backward) and dequantizes again in backward. bitsandbytes' own
``Linear4bit`` keeps its packed weight in the autograd context rather than as a saved tensor, which
block swapping cannot see, so the NF4 path calls bitsandbytes' quantize/dequantize functions only.

Original precision
------------------
A ``LowPrecisionLinear`` keeps a reference to the weight it was built from (in host memory, where the
model was loaded; never on the device). Its ``state_dict`` writes that original weight under the
usual ``weight`` key, and loading a state dict stores the given weight as the original and quantizes
it again. So checkpoints of a run with ``base_precision`` hold the base exactly as loaded, resume
re-quantizes it identically, and every merged export (``export_merged``, the diffusers export) merges
the adapters into the original-precision weights, never into the quantized copy. The cost is host
memory: the original base weights stay in RAM for the run.

Placement: ``.to(dtype)`` (the booster's cast to bf16) leaves the stored FP8/NF4 weight and its scales
as they are (they are viewed as integers while the conversion runs); ``.to(device)`` moves them.
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError
from ..models.blocks import find_blocks

BASE_PRECISIONS = ("none", "fp8", "nf4")
FP8_MAX = 448.0        # largest finite float8 e4m3fn value
NF4_BLOCK = 64         # weights per NF4 absmax (QLoRA's block size)


def _bitsandbytes():
    try:
        import bitsandbytes.functional as bnb_functional
    except Exception as e:  # not installed, or its native library failed to load
        raise ConfigError(f"lora.base_precision=nf4 stores the frozen base in bitsandbytes' NF4, and bitsandbytes "
                          f"cannot be imported here ({type(e).__name__}: {e}). Install it (pip install "
                          f"bitsandbytes), or use lora.base_precision=fp8 (no extra package) or none.") from None
    return bnb_functional


class _LowPrecisionLinearFn(torch.autograd.Function):
    """y = x W^T + b with W dequantized from the stored tensors; saves the stored tensors, not W."""

    @staticmethod
    def forward(ctx, x, bias, layer, *stored):
        ctx.layer, ctx.x_dtype = layer, x.dtype
        ctx.save_for_backward(*stored)
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        w = layer.dequantize(stored, dtype)                                # [out, in]
        return F.linear(x, w, None if bias is None else bias.to(dtype))   # [..., out]

    @staticmethod
    def backward(ctx, grad_y):
        # grad_y: [..., out]; the base is frozen: only the input gets a gradient.
        stored = ctx.saved_tensors
        w = ctx.layer.dequantize(stored, grad_y.dtype)                     # [out, in]
        grad_x = (grad_y @ w).to(ctx.x_dtype)                              # [..., in]
        return (grad_x, None, None) + (None,) * len(stored)


class LowPrecisionLinear(nn.Module):
    """A frozen ``nn.Linear`` whose weight is stored in ``storage`` ("fp8" or "nf4"); see the module
    docstring. ``original`` is the weight it was built from (kept by reference, written by state_dict)."""

    def __init__(self, linear: nn.Linear, storage: str):
        super().__init__()
        if storage not in ("fp8", "nf4"):
            raise ValueError(f"storage must be fp8 or nf4, got {storage!r}")
        self.in_features, self.out_features, self.storage = linear.in_features, linear.out_features, storage
        self.original = linear.weight.detach()
        weight, scale, self.quant_state = self._quantized(self.original)
        self.weight = nn.Parameter(weight, requires_grad=False)
        if scale is not None:
            self.register_buffer("scale", scale, persistent=False)
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def _quantized(self, w: torch.Tensor):
        """(stored weight, fp8 row scales or None, NF4 quant state or None) of the weight ``w`` [out, in]."""
        if self.storage == "fp8":
            w = w.detach().float()
            scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
            return (w / scale).to(torch.float8_e4m3fn), scale, None          # [out, in] fp8, [out, 1] fp32
        packed, state = _bitsandbytes().quantize_4bit(w.detach(), blocksize=NF4_BLOCK, quant_type="nf4",
                                                      compress_statistics=False)
        return packed, None, state                                            # [out * in / 2, 1] uint8

    def stored(self) -> Tuple[torch.Tensor, ...]:
        return (self.weight, self.scale) if self.storage == "fp8" else (self.weight,)

    def dequantize(self, stored: Tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] in ``dtype`` from the stored tensors."""
        if self.storage == "fp8":
            weight, scale = stored
            return weight.to(dtype) * scale.to(dtype)
        weight, = stored
        state = self.quant_state
        if state.absmax.device != weight.device:
            state.to(weight.device)
        return _bitsandbytes().dequantize_4bit(weight, state).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        return _LowPrecisionLinearFn.apply(x, self.bias, self, *self.stored())

    def _apply(self, fn, recurse=True):
        # Casts must not touch the stored representation: view it as integers while fn runs.
        as_int = {"weight": torch.uint8, "scale": torch.int32}
        kept = {}
        for name, int_dtype in as_int.items():
            t = getattr(self, name, None)
            if t is not None and t.dtype != int_dtype:
                kept[name] = t.dtype
                self._set(name, t.data.view(int_dtype))
        try:
            return super()._apply(fn, recurse)
        finally:
            for name, dtype in kept.items():
                self._set(name, getattr(self, name).data.view(dtype))
            if self.quant_state is not None and self.quant_state.absmax.device != self.weight.device:
                self.quant_state.to(self.weight.device)

    def _set(self, name: str, t: torch.Tensor) -> None:
        if name in self._parameters:
            self._parameters[name].data = t
        else:
            self._buffers[name] = t

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.original
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias if keep_vars else self.bias.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for name in ("weight", "bias") if self.bias is not None else ("weight",):
            key = prefix + name
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value = state_dict[key]
            if tuple(value.shape) != (self.out_features, self.in_features)[:value.dim()] and name == "weight":
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)}, the "
                                  f"layer holds ({self.out_features}, {self.in_features})")
                continue
            with torch.no_grad():
                if name == "bias":
                    self.bias.copy_(value)
                    continue
                # The stored tensors are written in place: block swapping holds them as its host copies.
                self.original = value.detach().to(device=self.original.device, dtype=self.original.dtype, copy=True)
                weight, scale, state = self._quantized(self.original.to(self.weight.device))
                self.weight.copy_(weight)
                if scale is not None:
                    self.scale.copy_(scale)
                if state is not None:
                    self.quant_state.absmax.copy_(state.absmax.to(self.quant_state.absmax.device))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"storage={self.storage}")


@dataclass(frozen=True)
class PrecisionReport:
    """What ``apply_base_precision`` did; ``str()`` is one line for the training log."""

    precision: str
    layers: int
    original_bytes: int
    stored_bytes: int
    names: Tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.precision == "none":
            return "base precision: as loaded"
        return (f"base precision: {self.layers} frozen linear layers of the blocks stored in {self.precision}, "
                f"{self.original_bytes / 2**30:.2f} GiB -> {self.stored_bytes / 2**30:.2f} GiB on the device "
                f"(the original weights stay in host memory for checkpoints and the merged export)")


def _stored_bytes(layer: LowPrecisionLinear) -> int:
    tensors: List[torch.Tensor] = list(layer.stored())
    if layer.quant_state is not None:
        tensors += [layer.quant_state.absmax, layer.quant_state.code]
    return sum(t.numel() * t.element_size() for t in tensors)


def apply_base_precision(model: nn.Module, precision: Optional[str]) -> PrecisionReport:
    """Store every frozen ``nn.Linear`` weight inside ``model``'s blocks in ``precision`` ("fp8", "nf4";
    "none"/None: leave the model as it is), in place. Apply after ``apply_lora`` (adapters are trainable
    and stay as they are) and before block swapping (the host then holds the low-precision copies).
    Raises ConfigError when nothing is frozen (no LoRA) or bitsandbytes is missing for nf4."""
    precision = precision or "none"
    if precision not in BASE_PRECISIONS:
        raise ConfigError(f"lora.base_precision={precision!r} is not one of {', '.join(BASE_PRECISIONS)}.")
    if precision == "none":
        return PrecisionReport("none", 0, 0, 0)
    if precision == "nf4":
        _bitsandbytes()
    names = {id(m): n for n, m in model.named_modules()}
    targets = []
    for block in find_blocks(model):
        for name, module in block.named_modules():
            if type(module) is nn.Linear and not module.weight.requires_grad:
                parent_name, _, child = name.rpartition(".")
                targets.append((block.get_submodule(parent_name) if parent_name else block, child, module,
                                f"{names[id(block)]}.{name}"))
    if not targets:
        raise ConfigError(f"lora.base_precision={precision} stores frozen base weights in low precision, but "
                          f"{type(model).__name__}'s blocks have no frozen linear layer: it needs LoRA (lora.rank > "
                          f"0), whose base is frozen.")
    original = stored = 0
    ignore = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
    for parent, child, linear, name in targets:
        layer = LowPrecisionLinear(linear, precision)
        setattr(parent, child, layer)
        original += layer.original.numel() * layer.original.element_size()
        stored += _stored_bytes(layer)
        ignore.update(f"{name}.{t}" for t in ("weight", "scale") if hasattr(layer, t))
    # Frozen and built alike on every rank from the same weights: DDP need not broadcast them (and gloo has
    # no float8 type to broadcast them in).
    model._ddp_params_and_buffers_to_ignore = sorted(ignore)
    return PrecisionReport(precision, len(targets), original, stored, tuple(t[3] for t in targets))
