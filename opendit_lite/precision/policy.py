"""The training precision as one value, resolved once from its name and the device.

    precision = resolve_precision(cfg.precision, device.type, allow_tf32=cfg.allow_tf32)
    plugin = OpenDiTPlugin(precision=precision)             # or precision="bf16": resolved there
    plan_config(cfg, 80, 8, precision=precision)            # the planner's bytes per activation

The names a config or ``OpenDiTPlugin`` takes, and what each resolves to:

=========  ================  ====================  ===========================================
name       ``param_dtype``   ``autocast_dtype``    what else
=========  ================  ====================  ===========================================
fp32       float32           None                  TF32 matmuls only with ``allow_tf32`` (CUDA)
tf32       float32           None                  TF32 matmuls and convolutions (CUDA)
bf16       bfloat16          bfloat16              fp32 master weights in the optimizer
fp16       float16           float16               and dynamic loss scaling
fp8        bfloat16          bfloat16              the blocks' Linear layers in float8 (``fp8.py``)
auto       bf16 on CUDA, fp32 on the CPU
=========  ================  ====================  ===========================================

``param_dtype`` is the working weights' dtype where a strategy casts the model (ZeRO, Gemini: fp32
master weights live in the optimizer); DDP keeps fp32 weights and runs the forward under
``torch.autocast(autocast_dtype)``. ``auto`` is fp32 on the CPU because CPUs have no fast bf16
matmul: a bf16 run there is several times slower than fp32 (about 9x for DiT-Mini/4 on two cores);
an explicit bf16 or fp16 on the CPU is kept, with a one-line warning on stderr (once per name); fp8
needs a GPU with FP8 tensor cores (``fp8.check_fp8_supported``).
"""

import sys
from dataclasses import dataclass
from typing import Optional, Set

import torch

PRECISION_NAMES = ("auto", "fp32", "tf32", "bf16", "fp16", "fp8")

# name -> (param_dtype, autocast_dtype)
_DTYPES = {
    "fp32": (torch.float32, None),
    "tf32": (torch.float32, None),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp16": (torch.float16, torch.float16),
    "fp8": (torch.bfloat16, torch.bfloat16),
}
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

_warned: Set[str] = set()  # names already warned about on the CPU in this process


@dataclass(frozen=True)
class Precision:
    """A resolved training precision (never ``auto``); see the module docstring for each name."""

    name: str                                # fp32, tf32, bf16, fp16 or fp8
    param_dtype: torch.dtype                 # working weights under ZeRO / Gemini
    autocast_dtype: Optional[torch.dtype]    # DDP's forward under autocast; None: plain fp32
    fp8: bool = False                        # the blocks' Linear layers in float8 (torchao)
    tf32: bool = False                       # TF32 matmuls and convolutions (set only on CUDA)

    @property
    def dtype_name(self) -> str:
        """"fp32", "bf16" or "fp16": ``param_dtype`` by the names Colossal-AI's wrappers and
        ``grad_precision`` use (tf32 runs fp32 weights, fp8 bf16 ones)."""
        return _DTYPE_NAMES[self.param_dtype]

    @property
    def element_bytes(self) -> int:
        """Bytes of one activation element (the memory planner's unit): 2 in bf16/fp16/fp8
        (the float8 matmul inputs are cast inside each Linear; what the blocks save is bf16), 4 in fp32."""
        return torch.finfo(self.autocast_dtype or torch.float32).bits // 8


def resolve_precision(name: str, device_type: Optional[str] = None, allow_tf32: bool = False) -> Precision:
    """The ``Precision`` of ``name`` (one of ``PRECISION_NAMES``) on ``device_type`` ("cuda" or "cpu";
    default: "cuda" when a GPU is visible). ``auto`` becomes bf16 on CUDA and fp32 elsewhere;
    ``allow_tf32`` turns TF32 matmuls on for any name (CUDA only; ``tf32`` always has them).
    Raises ValueError for an unknown name."""
    if name not in PRECISION_NAMES:
        raise ValueError(f"precision={name!r} is not supported; use one of {', '.join(PRECISION_NAMES)}")
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "auto":
        name = "bf16" if device_type == "cuda" else "fp32"
    elif name in ("bf16", "fp16") and device_type == "cpu" and name not in _warned:
        _warned.add(name)
        print(f"warning: precision={name} on the CPU is several times slower than fp32 (no fast {name} matmul "
              f"there); precision=auto picks fp32 on the CPU", file=sys.stderr)
    param_dtype, autocast_dtype = _DTYPES[name]
    return Precision(name, param_dtype, autocast_dtype, fp8=name == "fp8",
                     tf32=device_type == "cuda" and (name == "tf32" or allow_tf32))


def enable_tf32_matmuls(precision: Precision) -> None:
    """Allow TF32 in CUDA matmuls and convolutions (a process-wide setting) when ``precision.tf32``;
    nothing otherwise (the current settings stay)."""
    if precision.tf32 and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
