"""Weight memory of a run and the step-time cost of the weight-memory settings: what the planner adds
to ``memory_model.py`` (activations, ZeRO states) to answer "what do I set to fit this card".

Weights by role (``WeightShape``, read from the model built on the meta device, with the run's LoRA
adapters when it has them):

* a LoRA run's frozen base: the ``nn.Linear`` weights inside the blocks (what ``lora.base_precision``
  stores in FP8 or NF4), the blocks' other frozen tensors (biases, norms, modulation tables) and the
  parameters outside the blocks (embedders, final layer). Every rank holds all of them in the working
  dtype: 4 bytes under DDP (zero_degree 0 keeps fp32 weights and autocasts), 2 under ZeRO-1/2 (its
  bf16 working copy); FP8 stores 1 byte per linear weight (+ one fp32 scale per row), NF4 0.5 + 4/64.
  ``memory.blocks_to_swap`` = N keeps N blocks' frozen tensors in host memory; at most two of them
  are on the device at a time (the running block and the prefetched one).
* the trainable parameters (the adapters, or every parameter of a full fine-tune): ZeRO's formulas
  (``memory_model.model_state_bytes``) and the sharded fp32 EMA. Gemini's optimizer offload
  (``memory.gemini_offload_optim_frac`` = f, zero_degree 3) keeps a fraction f of the fp32 master
  weights and Adam moments (12 bytes per parameter) in host memory.

Step-time costs, relative to the step without the setting (``Speed`` gives the device's numbers; the
defaults describe a 24 GB PCIe card: 60 TFLOP/s achieved in bf16 with fp32 accumulation, 25 GB/s
pinned host -> device copies over PCIe 4.0 x16, 1000 GB/s device memory):

* one step's compute: forward 2 x (linear weights) x tokens plus attention 4 x tokens^2 x width per
  block (full attention over the sample's tokens, divided by the SP size); backward 1x the linear
  forward for a LoRA run (input gradients only) or 2x for a full fine-tune, 2x the attention forward.
* swapping N blocks: each block's copy (its stored bytes / host->device bandwidth) hides behind the
  compute of the blocks before it (the swapped blocks are spread evenly, so depth / N blocks of compute
  per copy in forward, and their backward in backward); what does not hide is exposed, as are the first
  block's copies of each pass (nothing runs before them). Counted at batch 1, the least compute to hide
  behind.
* FP8 / NF4 storage: each use of a linear layer (forward, backward, recomputation) reads the stored
  weight and writes and reads a bf16 copy: (stored + 4) bytes per weight at the device memory bandwidth.
* Gemini optimizer offload: per step the offloaded fraction's gradients go to the host and weights come
  back (2 + 2 bytes per parameter over PCIe) and Adam runs on the CPU at 1e9 parameters per second.
"""

from dataclasses import dataclass
from typing import Dict, Optional

import torch.nn as nn

from ..models.blocks import find_blocks

STORED_BYTES = {"fp8": 1.0, "nf4": 0.5 + 4 / 64}  # bytes per stored linear weight (+ scales)
CPU_ADAM_PARAMS_PER_S = 1e9


@dataclass(frozen=True)
class WeightShape:
    """Parameter counts of a model by role (see the module docstring)."""

    depth: int
    block_linear: int   # frozen nn.Linear weights inside the blocks, all blocks
    block_other: int    # other frozen tensors inside the blocks
    outside: int        # frozen parameters outside the blocks
    trainable: int      # adapters (LoRA) or every parameter (full fine-tune)
    lora: bool

    @classmethod
    def of(cls, model: nn.Module) -> "WeightShape":
        blocks = find_blocks(model)
        inside = {id(p) for b in blocks for p in b.parameters()}
        linear = {id(m.weight) for b in blocks for m in b.modules()
                  if type(m) is nn.Linear and not m.weight.requires_grad}
        frozen = [p for p in model.parameters() if not p.requires_grad]
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return cls(depth=len(blocks),
                   block_linear=sum(p.numel() for p in frozen if id(p) in linear),
                   block_other=sum(p.numel() for p in frozen if id(p) in inside and id(p) not in linear),
                   outside=sum(p.numel() for p in frozen if id(p) not in inside),
                   trainable=trainable, lora=bool(frozen))

    @property
    def linear_per_block(self) -> float:
        return self.block_linear / self.depth

    def block_bytes(self, base_precision: str, working_bytes: int) -> float:
        """Device bytes of one block's frozen tensors."""
        stored = STORED_BYTES.get(base_precision, working_bytes)
        return (self.block_linear * stored + self.block_other * working_bytes) / self.depth


def working_bytes(zero_degree: int, element_bytes: int) -> int:
    """Bytes per element of the weights every rank computes with: DDP keeps fp32 and autocasts."""
    return 4 if zero_degree == 0 else element_bytes


def frozen_device_bytes(w: WeightShape, zero_degree: int, element_bytes: int, base_precision: str = "none",
                        blocks_to_swap: int = 0) -> float:
    """Device bytes of the frozen weights: outside the blocks, resident blocks, and at most two swapped ones."""
    work = working_bytes(zero_degree, element_bytes)
    on_device = w.depth - blocks_to_swap + min(blocks_to_swap, 2)
    return w.outside * work + w.block_bytes(base_precision, work) * on_device


def host_bytes(w: WeightShape, zero_degree: int, element_bytes: int, base_precision: str, blocks_to_swap: int,
               optim_offload: float, ranks: int) -> float:
    """Host memory per rank the settings add: swapped blocks (pinned), the original weights a
    low-precision base keeps for checkpoints, and Gemini's offloaded optimizer states."""
    work = working_bytes(zero_degree, element_bytes)
    swapped = w.block_bytes(base_precision, work) * blocks_to_swap
    originals = w.block_linear * work if base_precision != "none" else 0
    return swapped + originals + 12 * w.trainable * optim_offload / ranks


@dataclass(frozen=True)
class Speed:
    """The device's throughputs the step-time costs assume (module docstring)."""

    tflops: float = 60.0       # achieved dense bf16 matmul throughput
    h2d_gbps: float = 25.0     # pinned host -> device copies
    hbm_gbps: float = 1000.0   # device memory bandwidth

    def describe(self) -> str:
        return (f"{self.tflops:g} TFLOP/s achieved, {self.h2d_gbps:g} GB/s host->device, {self.hbm_gbps:g} GB/s "
                f"device memory (--tflops, --h2d-gbps)")


def block_seconds(w: WeightShape, hidden: int, tokens: int, speed: Speed) -> Dict[str, float]:
    """Forward and backward seconds of one block over ``tokens`` tokens (one sample on one rank; the
    attention over the sample's tokens)."""
    linear = 2 * w.linear_per_block * tokens
    attention = 4 * tokens * tokens * hidden
    backward = (1 if w.lora else 2) * linear + 2 * attention
    return {"forward": (linear + attention) / (speed.tflops * 1e12), "backward": backward / (speed.tflops * 1e12)}


def step_seconds(w: WeightShape, hidden: int, tokens: int, recomputed: float, speed: Speed,
                 depth: Optional[int] = None) -> float:
    """Compute seconds of one sample's step: each of the ``depth`` blocks a sample runs through (None: all of
    ``w``'s; one expert's of Wan 2.2's two) forward and backward, ``recomputed`` blocks twice."""
    s = block_seconds(w, hidden, tokens, speed)
    return (depth or w.depth) * (s["forward"] + s["backward"]) + recomputed * s["forward"]


def swap_seconds(w: WeightShape, hidden: int, tokens: int, blocks_to_swap: int, block_bytes: float,
                 speed: Speed) -> float:
    """Exposed copy seconds per step of ``blocks_to_swap`` swapped blocks (module docstring)."""
    if not blocks_to_swap:
        return 0.0
    copy = block_bytes / (speed.h2d_gbps * 1e9)
    s = block_seconds(w, hidden, tokens, speed)
    between = w.depth / blocks_to_swap  # blocks of compute between two swapped blocks
    exposed = sum(max(0.0, copy - between * s[phase]) for phase in ("forward", "backward"))
    return 2 * copy + (blocks_to_swap - 1) * exposed


def dequantize_seconds(w: WeightShape, base_precision: str, uses: float, speed: Speed) -> float:
    """Seconds per step spent turning FP8/NF4 weights into bf16 ones, ``uses`` uses of each layer."""
    if base_precision == "none":
        return 0.0
    return w.block_linear * (STORED_BYTES[base_precision] + 4) * uses / (speed.hbm_gbps * 1e9)


def optim_offload_seconds(w: WeightShape, fraction: float, ranks: int, speed: Speed) -> float:
    """Seconds per step Gemini's optimizer offload adds (module docstring)."""
    params = w.trainable * fraction / ranks
    return params * 4 / (speed.h2d_gbps * 1e9) + params / CPU_ADAM_PARAMS_PER_S


__all__ = ["STORED_BYTES", "Speed", "WeightShape", "block_seconds", "dequantize_seconds", "frozen_device_bytes",
           "host_bytes", "optim_offload_seconds", "step_seconds", "swap_seconds", "working_bytes"]
