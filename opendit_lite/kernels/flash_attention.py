"""flash-attn as an attention backend, and the choice of backend from the ``attention_backend`` key.

``FlashAttentionOp`` calls ``flash_attn.flash_attn_func`` (FlashAttention-2) for the inputs it
supports: CUDA tensors in fp16 or bf16 without a mask. Anything else (fp32 inputs, CPU tensors, an
attention mask) goes to torch's SDPA exactly as ``SDPAAttentionOp`` does, so a converted model
still runs everywhere; both take and return the ``[B, N, H, Dh]`` layout, flash-attn's own, so no
transpose is needed on the flash path.
"""

import importlib.metadata
from typing import Optional, Tuple

import torch

from .attention_op import SDPAAttentionOp

ATTENTION_BACKENDS = ("sdpa", "flash", "auto")

try:
    from flash_attn import flash_attn_func
except ImportError:  # flash-attn not installed (or built for another torch): SDPA serves every call.
    flash_attn_func = None


def flash_attn_version() -> Optional[str]:
    """The installed flash-attn version, or None when ``flash_attn_func`` does not import."""
    if flash_attn_func is None:
        return None
    try:
        return importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:  # imported from a source tree
        return "unknown version"


class FlashAttentionOp(SDPAAttentionOp):
    """flash-attn where it applies, SDPA elsewhere. q, k, v: [B, N, H, Dh] -> [B, N, H, Dh]."""

    backend = "flash"

    @staticmethod
    def flash_applies(q: torch.Tensor, attn_mask: Optional[torch.Tensor]) -> bool:
        """flash-attn takes CUDA fp16/bf16 inputs and no mask."""
        return (flash_attn_func is not None and attn_mask is None and q.is_cuda
                and q.dtype in (torch.float16, torch.bfloat16))

    def forward(self, q, k, v, attn_mask=None):
        if self.flash_applies(q, attn_mask):
            return flash_attn_func(q, k, v)      # [B, N, H, Dh]
        return super().forward(q, k, v, attn_mask=attn_mask)


def resolve_attention_backend(requested: str) -> Tuple[str, str]:
    """``(backend, reason)`` for ``attention_backend = requested``.

    "sdpa" keeps torch SDPA; "flash" and "auto" take flash-attn when it imports and fall back to
    SDPA when it does not ("flash" says so in the reason, which the conversion report prints).
    """
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend={requested!r} is not one of {', '.join(ATTENTION_BACKENDS)}")
    if requested == "sdpa":
        return "sdpa", "attention_backend=sdpa"
    version = flash_attn_version()
    if version is None:
        if requested == "flash":
            return "sdpa", "attention_backend=flash but flash-attn is not installed"
        return "sdpa", "flash-attn not installed"
    return "flash", f"flash-attn {version} for CUDA fp16/bf16 inputs without a mask, SDPA otherwise"
