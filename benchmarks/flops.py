"""Model FLOPs per sample for MFU, derived from each model family's architecture, and the dense
bf16 peaks MFU is measured against.

Conventions (those of the PaLM paper's MFU and of nanoGPT's estimate):

* A multiply-add is 2 FLOPs. The DiT paper reports "Gflops" that are multiply-adds (DiT-XL/2:
  118.6 G per 256 px image), so its numbers are half of ours.
* Only matrix products are counted (linear layers, convolutions, attention's two N x N products);
  norms, activations, softmax and the optimizer are memory-bound and left out.
* Training = forward + backward = 3 x forward: the backward of ``y = x W`` is two products of the
  same size, one for the input gradient and one for the weight gradient. Recomputation under
  activation checkpointing is not counted: model FLOPs measure useful work, so a configuration
  that recomputes pays for it in a lower MFU.

New model families add a ``<family>_forward_flops(model)`` here and reference it from their input
builder in ``train_step.py``.
"""

from typing import Optional

import torch.nn as nn

# The dense bf16 peaks MFU is measured against live with the training loop's MFU.
from opendit_lite.training.mfu import DENSE_BF16_PEAK_TFLOPS, device_peak_tflops  # noqa: E402,F401

# ----------------------------------------------------------------------------------------------
# DiT
# ----------------------------------------------------------------------------------------------

def dit_forward_macs(depth: int, hidden_size: int, num_tokens: int, patch_size: int, in_channels: int,
                     out_channels: int, mlp_hidden: int, frequency_embedding_size: int = 256) -> int:
    """Multiply-adds of one DiT forward for one sample (N tokens of width D, L blocks).

    Per block, with N tokens, D hidden, M the MLP's hidden width (4D):
        adaLN modulation  D x 6D                   (once per sample, on the conditioning vector)
        q, k, v, output   4 N D^2                  (four D x D projections of every token)
        attention         2 N^2 D                  (Q K^T and P V: N x N x D each, summed over heads)
        MLP               2 N D M  (= 8 N D^2)     (D -> M -> D)
    Outside the blocks:
        patch embedding   N (C p^2) D              (a p x p stride-p convolution = per-token linear)
        timestep MLP      F D + D^2                (sinusoidal features F -> D -> D)
        label embedding   0                        (a table lookup)
        final layer       D x 2D + N D (p^2 C_out) (its adaLN, then the per-token output projection)
    """
    d, n = hidden_size, num_tokens
    per_block = 6 * d * d + 4 * n * d * d + 2 * n * n * d + 2 * n * d * mlp_hidden
    embed = n * in_channels * patch_size ** 2 * d + frequency_embedding_size * d + d * d
    final = 2 * d * d + n * d * patch_size ** 2 * out_channels
    return depth * per_block + embed + final


def dit_forward_flops(model: nn.Module) -> float:
    """Forward FLOPs per sample of a ``DiT`` instance (2 per multiply-add), read from its modules."""
    block = model.blocks[0]
    return 2.0 * dit_forward_macs(
        depth=len(model.blocks),
        hidden_size=model.pos_embed.shape[-1],
        num_tokens=model.x_embedder.num_patches,
        patch_size=model.patch_size,
        in_channels=model.in_channels,
        out_channels=model.out_channels,
        mlp_hidden=block.mlp.fc1.out_features,
        frequency_embedding_size=model.t_embedder.frequency_embedding_size,
    )


def train_flops(forward_flops: float) -> float:
    """Training-step FLOPs from forward FLOPs: forward + a backward of twice the forward (see top)."""
    return 3.0 * forward_flops


def mfu(achieved_tflops_per_device: float, peak_tflops: Optional[float]) -> Optional[float]:
    """Model FLOPs utilisation: achieved model TFLOP/s per device over the device's dense peak."""
    return None if not peak_tflops else achieved_tflops_per_device / peak_tflops

