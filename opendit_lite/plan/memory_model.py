"""Memory per device of one training step: model states (ZeRO formulas), the sharded EMA and the
activations kept for backward, per token.

Model states (Rajbhandari et al., "ZeRO", 2020), Psi parameters, mixed precision with Adam: 2 Psi
bytes of bf16 weights, 2 Psi of bf16 gradients and K Psi of optimizer state (fp32 master weights,
momentum and variance: K = 12), over N ranks (ZeRO shards over the whole world here)::

    DDP (0):       (4 + 4 + 8) Psi     our DDP keeps fp32 weights and gradients, Adam's 2 fp32 moments
    ZeRO-1 (1):    (2 + 2) Psi + K Psi / N
    ZeRO-2 (2):    2 Psi + (2 + K) Psi / N
    ZeRO-3 (3):    (2 + 2 + K) Psi / N
    sharded EMA:   4 Psi / N (fp32, any degree)

Activations: a transformer block keeps a fixed number of D-wide vectors per token for its
backward (inputs of every linear, norm and attention, the attention output, the MLP's hidden
activations, ...), so a block's saved bytes are ``widths x D x tokens x bytes per element``. The
widths of each block type (``ActivationProfile``) were counted once from the tensors autograd
saves (``torch.autograd.graph.saved_tensors_hooks``, fp32, SDPA attention, which saves O(N) per
head rather than the N x N scores) and expressed in the MLP ratio r:

    DiT block     12 + 2r   (norms 2x2, modulated inputs 2, q/k/v 3, attention out 1, gated branch
                             outputs 2, MLP hidden 2r; plus per-head softmax statistics)
    STDiT block   21 + 2r   (DiT's, plus temporal attention 6 and cross-attention 3)
    Vchitect      23.5 + 2r (joint spatial, temporal with RoPE and MLP; the caption stream adds
                             about 8.5 widths per caption token per frame)

plus about 3 widths per token outside the blocks (patch embedding, positional table, final layer).
A model without a declared profile (the diffusers families) has its widths counted from its own
forward on the meta device (``activation_count.py``): per block per token, per block per caption token,
and outside the blocks.
``tests/plan/test_memory_model.py`` checks the prediction against the counted bytes at other widths
and shapes (within 15%). A checkpointed block keeps only its input (1 width), recomputing the rest
in backward, when one block's full set is alive again; with offload that input lives in host
memory. Sequence parallelism divides the video tokens of a sample by the SP size.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch.nn as nn

GiB = 2 ** 30
ADAM_K = 12  # fp32 master weights + momentum + variance: 3 x 4 bytes per parameter
OUTSIDE_BLOCK_WIDTHS = 3.0  # saved widths per token outside the blocks (embedding, final layer)


def model_state_bytes(zero_degree: int, params: float, ranks: int) -> float:
    """Bytes per device of weights, gradients and optimizer state (the formulas in the docstring)."""
    if zero_degree == 0:
        return (4 + 4 + 8) * params  # fp32 weights + fp32 grads + two fp32 Adam moments
    if zero_degree == 1:
        return (2 + 2) * params + ADAM_K * params / ranks
    if zero_degree == 2:
        return 2 * params + (2 + ADAM_K) * params / ranks
    if zero_degree == 3:
        return (2 + 2 + ADAM_K) * params / ranks
    raise ValueError(f"zero_degree must be 0..3, got {zero_degree}")


def ema_bytes(params: float, ranks: int) -> float:
    """The fp32 EMA, sharded over all ranks."""
    return 4 * params / ranks


@dataclass(frozen=True)
class ActivationProfile:
    """Saved D-wide vectors of one block: per video token, per caption token of each frame (a caption
    repeated per frame), and per caption token of a sample; outside the blocks: per video token and per
    caption token of a sample."""

    token_widths: float
    caption_widths_per_frame: float = 0.0
    caption_widths: float = 0.0
    outside_widths: float = OUTSIDE_BLOCK_WIDTHS
    outside_caption_widths: float = 0.0
    source: str = "declared for its block type"


# Model class -> profile from the block's MLP ratio; filled by ``register_activation_profile``.
ACTIVATION_PROFILES: Dict[type, Callable[[float], ActivationProfile]] = {}


def register_activation_profile(model_type: type, profile: Callable[[float], ActivationProfile]) -> None:
    """Declare the per-block saved widths of ``model_type`` (a function of the MLP ratio)."""
    if model_type in ACTIVATION_PROFILES:
        raise ValueError(f"{model_type.__qualname__} already has an activation profile")
    ACTIVATION_PROFILES[model_type] = profile


def _register_builtin() -> None:
    from ..models.dit import DiT
    from ..models.stdit import STDiT
    from ..models.vchitect import VchitectXL

    register_activation_profile(DiT, lambda r: ActivationProfile(12 + 2 * r))
    register_activation_profile(STDiT, lambda r: ActivationProfile(21 + 2 * r))
    register_activation_profile(VchitectXL, lambda r: ActivationProfile(23.5 + 2 * r, caption_widths_per_frame=8.5))


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know about a model."""

    name: str
    params: int
    hidden_size: int
    depth: int
    num_heads: int
    patch_size: tuple          # (pt, ph, pw); images: (1, p, p)
    profile: ActivationProfile

    @classmethod
    def counted(cls, model: nn.Module, name: str, hidden: int, num_heads: int, patch: tuple, depth: int,
                profile: ActivationProfile) -> "ModelShape":
        """A shape whose profile was counted from the model (``activation_count.counted_profile``)."""
        return cls(name, sum(p.numel() for p in model.parameters()), hidden, depth, num_heads, tuple(patch), profile)

    @classmethod
    def of(cls, model: nn.Module, name: Optional[str] = None) -> "ModelShape":
        """Read the shape of a built model (a meta-device model is enough)."""
        if not ACTIVATION_PROFILES:
            _register_builtin()
        factory = next((f for t, f in ACTIVATION_PROFILES.items() if isinstance(model, t)), None)
        if factory is None:
            raise ValueError(f"{type(model).__qualname__} has no activation profile; declare one with "
                             f"register_activation_profile")
        block = model.blocks[0]
        hidden = block.mlp.fc1.in_features
        patch = model.patch_size
        patch = tuple(patch) if isinstance(patch, (tuple, list)) else (1, patch, patch)
        return cls(name or type(model).__name__, sum(p.numel() for p in model.parameters()), hidden,
                   len(model.blocks), model.num_heads, patch, factory(block.mlp.fc1.out_features / hidden))


def sample_tokens(shape: ModelShape, frames: int, height: int, width: int, extra_tokens: int = 0) -> int:
    """Video tokens of one latent sample of (frames, height, width), and ``extra_tokens`` more on the same
    sequence axis (an edit model's reference image)."""
    pt, ph, pw = shape.patch_size
    return -(-frames // pt) * (height // ph) * (width // pw) + extra_tokens


def activation_bytes(shape: ModelShape, frames: int, height: int, width: int, batch: int, element_bytes: int,
                     sp_size: int = 1, selective_ratio: float = 1.0, offload: bool = False,
                     caption_tokens: int = 0, extra_tokens: int = 0) -> float:
    """Bytes of activations saved for backward by one rank's micro-batch of latent clips
    (frames, height, width) with ``extra_tokens`` more per sample on the sequence axis, at the peak (end of
    forward; a checkpointed model's peak adds one recomputed block)."""
    tokens = batch * -(-sample_tokens(shape, frames, height, width, extra_tokens) // sp_size)  # local video tokens
    latent_frames = batch * -(-frames // shape.patch_size[0])
    p = shape.profile
    full = (p.token_widths * tokens + p.caption_widths_per_frame * caption_tokens * latent_frames
            + p.caption_widths * caption_tokens * batch)
    kept = round(shape.depth * selective_ratio)                                       # blocks not checkpointed
    checkpointed = shape.depth - kept
    widths = kept * full + p.outside_widths * tokens + p.outside_caption_widths * caption_tokens * batch
    if checkpointed:
        widths += (0 if offload else checkpointed * tokens) + full                     # inputs + one recompute
    return widths * shape.hidden_size * element_bytes


def offloaded_activation_bytes(shape: ModelShape, frames: int, height: int, width: int, batch: int,
                               element_bytes: int, sp_size: int = 1, selective_ratio: float = 1.0,
                               offload: bool = False, extra_tokens: int = 0) -> float:
    """Host bytes of the checkpointed blocks' inputs that offload moves there (what ``activation_bytes``
    leaves out of the device's count under ``offload``): one width per token per checkpointed block."""
    if not offload:
        return 0.0
    tokens = batch * -(-sample_tokens(shape, frames, height, width, extra_tokens) // sp_size)
    checkpointed = shape.depth - round(shape.depth * selective_ratio)
    return checkpointed * tokens * shape.hidden_size * element_bytes


def step_bytes(shape: ModelShape, zero_degree: int, world_size: int) -> float:
    """Model states plus the EMA shard, per device."""
    return model_state_bytes(zero_degree, shape.params, world_size) + ema_bytes(shape.params, world_size)
