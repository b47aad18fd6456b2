"""``precision: fp8``: torchao's float8 training for the Linear layers of the transformer blocks.

The blocks' attention and MLP projections hold almost all of a DiT's matmul FLOPs; their inputs,
weights and output gradients are cast to float8 per tensor (dynamic scaling) inside torchao's
``Float8Linear`` and the matmuls run on the FP8 tensor cores of Hopper-class GPUs (compute
capability 8.9 and above). Everything else stays in bf16: the embedders, the final layer, and the
adaLN modulation projections that turn the conditioning into shift/scale/gate (small matmuls whose
outputs scale every activation, where FP8's 3-bit mantissa would cost accuracy for no speed).
The model keeps its parameters (``Float8Linear`` holds the same bf16/fp32 weight), so optimizer,
ZeRO-1/2 sharding, EMA and checkpoints are unchanged; torch.compile fuses the casts.

Which layers: every ``nn.Linear`` inside the model's repeated blocks (``get_fsdp_wrap_module_list``,
a declared capability), except those inside the submodules a block class names in its
``conditioning_modules`` attribute (DiT: ``adaLN_modulation``), and except layers whose feature
counts are not multiples of 16 (the FP8 matmul needs them).

torchao is imported only when FP8 is asked for: ``pip install torchao``.
"""

from typing import Callable, List, Set, Tuple

import torch
import torch.nn as nn

from ..errors import ConfigError

# FP8 tensor cores: Ada (8.9) and Hopper (9.0) and later.
FP8_MIN_CAPABILITY: Tuple[int, int] = (8, 9)

# The FP8 matmul (torch._scaled_mm) needs both feature counts to be multiples of 16.
FP8_DIM_MULTIPLE = 16


def check_fp8_supported(device: torch.device) -> None:
    """Raise ``ConfigError`` unless ``device`` is a CUDA GPU with FP8 tensor cores and torchao imports."""
    if device.type != "cuda":
        raise ConfigError(
            f"precision=fp8 needs a CUDA GPU with FP8 tensor cores (compute capability >= "
            f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]}: Ada, Hopper or newer); this run is on {device.type}. "
            f"Use precision=bf16 here."
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        raise ConfigError(
            f"precision=fp8 needs FP8 tensor cores (compute capability >= {FP8_MIN_CAPABILITY[0]}."
            f"{FP8_MIN_CAPABILITY[1]}); {torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}. "
            f"Use precision=bf16 on this GPU."
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"precision=fp8 uses torchao's float8 training, which does not import ({e}): "
                          f"pip install torchao") from None


def block_linear_filter(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """``filter(module, qualified_name) -> bool`` choosing the Linear layers to run in FP8 (see the
    module docstring); the signature of torchao's ``module_filter_fn``."""
    if not hasattr(model, "get_fsdp_wrap_module_list"):
        raise ValueError(f"{type(model).__name__} does not list its blocks (get_fsdp_wrap_module_list); "
                         f"precision=fp8 converts the blocks' Linear layers only")
    chosen: Set[int] = set()
    for block in model.get_fsdp_wrap_module_list():
        excluded = {id(m) for name in getattr(type(block), "conditioning_modules", ())
                    for m in getattr(block, name).modules()}
        chosen |= {id(m) for m in block.modules()
                   if isinstance(m, nn.Linear) and id(m) not in excluded
                   and m.in_features % FP8_DIM_MULTIPLE == 0 and m.out_features % FP8_DIM_MULTIPLE == 0}

    def module_filter(module: nn.Module, qualified_name: str) -> bool:
        return id(module) in chosen

    return module_filter


def fp8_linear_names(model: nn.Module) -> List[str]:
    """Qualified names of the Linear layers ``block_linear_filter`` picks (what would be converted)."""
    keep = block_linear_filter(model)
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and keep(m, name)]


def apply_fp8_training(model: nn.Module) -> List[str]:
    """Swap the blocks' Linear layers for torchao ``Float8Linear`` in place (tensorwise dynamic
    scaling); returns the converted layers' names. Call ``check_fp8_supported`` first."""
    from torchao.float8 import convert_to_float8_training

    names = fp8_linear_names(model)
    keep = block_linear_filter(model)
    convert_to_float8_training(model, module_filter_fn=keep)
    return names


def has_fp8_linears(model: nn.Module) -> bool:
    """True when ``apply_fp8_training`` has converted some of ``model``'s layers (torchao's
    ``Float8Linear``, recognised by name so that torchao is not imported to ask)."""
    return any(type(m).__name__ == "Float8Linear" for m in model.modules())
