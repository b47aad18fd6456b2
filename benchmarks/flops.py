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

from typing import Optional, Tuple

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



# ----------------------------------------------------------------------------------------------
# Wan (diffusers WanTransformer3DModel)
# ----------------------------------------------------------------------------------------------

def wan_forward_macs(config: dict, frames: int, height: int, width: int, text_tokens: int) -> Tuple[int, int]:
    """(linear, attention) multiply-adds of one Wan transformer forward for one sample of ``frames`` x
    ``height`` x ``width`` latents and ``text_tokens`` caption tokens, read from the diffusers config.

    N video tokens (latents over the (pt, ph, pw) patch), L caption tokens, D = heads x head_dim, F the
    FFN width, C_in / C_out latent channels, P = pt ph pw:
        patch embedding   N (C_in P) D
        caption embedder  L (text_dim D + D^2)             (two linear layers)
        time embedder     freq D + D^2 + D 6D              (sinusoid -> D -> D, then the modulation)
        per block         self q, k, v, o  4 N D^2
                          cross q, o       2 N D^2;  cross k, v  2 L D^2
                          FFN              2 N D F
        output            N D (C_out P)
    Attention products (Q K^T and P V), per block: self 2 N^2 D, cross 2 N L D. They are returned
    apart because their backward is always twice their forward (no weights: a LoRA step saves
    nothing on them), while a frozen linear layer's backward is one product (the input gradient)."""
    pt, ph, pw = config["patch_size"]
    d = config["num_attention_heads"] * config["attention_head_dim"]
    n = (frames // pt) * (height // ph) * (width // pw)
    lt, f, layers = text_tokens, config["ffn_dim"], config["num_layers"]
    p = pt * ph * pw
    per_block = 4 * n * d * d + 2 * n * d * d + 2 * lt * d * d + 2 * n * d * f
    linear = (n * config["in_channels"] * p * d + lt * (config["text_dim"] * d + d * d)
              + config.get("freq_dim", 256) * d + d * d + 6 * d * d + layers * per_block
              + n * d * config["out_channels"] * p)
    attention = layers * (2 * n * n * d + 2 * n * lt * d)
    return linear, attention


def wan_train_flops(config: dict, frames: int, height: int, width: int, text_tokens: int, lora: bool) -> float:
    """Model FLOPs of one training step for one sample: 3 x forward for a full fine-tune; for LoRA the
    frozen linear layers' backward is the input gradient alone (2 x their forward; the adapters' own
    products are under 1% at rank 32 and left out), attention's stays 2 x its forward."""
    linear, attention = wan_forward_macs(config, frames, height, width, text_tokens)
    return 2.0 * ((2 if lora else 3) * linear + 3 * attention)
