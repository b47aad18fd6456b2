"""The two primitives a ring needs, per (query block, key block) pair: attention that also returns the
log-sum-exp of each row, and its backward given the row's *final* output and log-sum-exp.

The attention ops of ``opendit_lite.kernels.attention_op`` return only the output, so the ring cannot
merge their results; these are the same backends one level down (aten's kernels behind SDPA).

Layout: q ``[B, H, nq, Dh]``, k/v ``[B, H, nk, Dh]``; ``bias``: None or an additive float mask
broadcastable to ``[B, H, nq, nk]`` (-inf: may not attend). ``forward`` returns ``(out [B, H, nq, Dh]``
in q's dtype, ``lse [B, H, nq]`` in fp32, fp64 for fp64 inputs). ``backward(dout, q, k, v, out, lse,
bias, scale)`` takes the final ``out``/``lse`` of the rows (merged over every key block, -inf replaced
by 0) and returns this block's ``(dq, dk, dv)``: with the final lse, ``exp(s - lse)`` is the block's
share of the whole row's softmax, so the blocks' gradients sum to the full gradient (FlashAttention-2's
backward, split by key blocks).

=======================  ==========================================  =================================
kernel                   device, dtypes, masks                       where it is tested
=======================  ==========================================  =================================
``CpuFlashKernel``       CPU; fp32/fp64/bf16/fp16; additive masks    every CPU test of the ring
``MathKernel``           any; any; any (explicit softmax in fp32)    CPU tests (reference, fallback)
``CudaEfficientKernel``  CUDA; fp32/fp16/bf16; additive masks        ``gpu``-marked test
``CudaFlashKernel``      CUDA; fp16/bf16; no mask                    ``gpu``-marked test
=======================  ==========================================  =================================

``select_kernel(q, bias)`` picks one per block (an unmasked block may use flash while a masked one
uses the memory-efficient kernel). Rows with no allowed key are normalised by the caller: the CPU
kernel reports lse = 0 and out = 0 for them, the ring needs lse = -inf.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

aten = torch.ops.aten
Tensor = torch.Tensor


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp32, or fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class MathKernel:
    """Explicit softmax in fp32: exact, any device and dtype, O(nq * nk) memory per block."""

    name = "math"

    @staticmethod
    def _scores(q, k, bias, scale):
        t = acc_dtype(q.dtype)
        s = torch.matmul(q.to(t), k.to(t).transpose(-1, -2)) * scale               # [B, H, nq, nk]
        return s if bias is None else s + bias.to(t)

    def forward(self, q, k, v, bias, scale) -> Tuple[Tensor, Tensor]:
        s = self._scores(q, k, bias, scale)
        lse = torch.logsumexp(s, dim=-1)                                             # [B, H, nq]
        p = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1))
        return torch.matmul(p, v.to(p.dtype)).to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, bias, scale) -> Tuple[Tensor, Tensor, Tensor]:
        s = self._scores(q, k, bias, scale)
        p = torch.exp(s - lse.unsqueeze(-1))                                         # this block's share
        t = p.dtype
        dout = dout.to(t)
        dv = torch.matmul(p.transpose(-1, -2), dout)                                 # [B, H, nk, Dh]
        delta = (dout * out.to(t)).sum(-1, keepdim=True)                             # [B, H, nq, 1]
        ds = p * (torch.matmul(dout, v.to(t).transpose(-1, -2)) - delta)             # [B, H, nq, nk]
        dq = torch.matmul(ds, k.to(t)) * scale
        dk = torch.matmul(ds.transpose(-1, -2), q.to(t)) * scale
        return dq, dk, dv


class CpuFlashKernel:
    """aten's CPU flash attention: takes an additive mask (in q's dtype), returns (out, lse)."""

    name = "cpu_flash"

    def forward(self, q, k, v, bias, scale):
        mask = None if bias is None else bias.to(q.dtype)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)
        return out, lse.to(acc_dtype(q.dtype))

    def backward(self, dout, q, k, v, out, lse, bias, scale):
        mask = None if bias is None else bias.to(q.dtype)
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(),
            lse.to(acc_dtype(q.dtype)).contiguous(), 0.0, False, attn_mask=mask, scale=scale)


def _aligned_bias(bias: Tensor, shape) -> Tensor:
    """The memory-efficient kernel wants the bias' last stride aligned to 16 elements: allocate a
    padded buffer and slice it (what SDPA does internally), then expand to the full shape."""
    nk = bias.size(-1)
    padded = -(-nk // 16) * 16
    if padded != nk:
        bias = F.pad(bias, (0, padded - nk))[..., :nk]
    return bias.expand(shape)


class CudaEfficientKernel:
    """aten's memory-efficient attention (CUDA): additive masks, fp32/fp16/bf16, lse on request."""

    name = "cuda_efficient"

    def forward(self, q, k, v, bias, scale):
        shape = (q.size(0), q.size(1), q.size(2), k.size(2))
        b = None if bias is None else _aligned_bias(bias.to(q.dtype), shape)
        out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, b, True, scale=scale)
        return out, lse[..., : q.size(2)].float()            # lse comes padded to a multiple of 32 rows

    def backward(self, dout, q, k, v, out, lse, bias, scale):
        shape = (q.size(0), q.size(1), q.size(2), k.size(2))
        b = None if bias is None else _aligned_bias(bias.to(q.dtype), shape)
        rows = -(-q.size(2) // 32) * 32
        lse = F.pad(lse.float(), (0, rows - q.size(2))).contiguous()
        zero = torch.zeros((), dtype=torch.int64, device=q.device)       # philox seed/offset: no dropout
        # The half-precision kernels compute rowsum(dout * out) themselves and take out's token stride
        # to be heads x head_dim: out must be laid out as the forward writes it, [B, nq, H, Dh] in
        # memory (a [B, H, nq, Dh] view of that), not [B, H, nq, Dh]-contiguous.
        out = out.to(q.dtype).transpose(1, 2).contiguous().transpose(1, 2)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            dout.to(q.dtype).contiguous(), q, k, v, b, out, lse, zero, zero, 0.0,
            [True, True, True, False], False, scale=scale)
        return dq, dk, dv


class CudaFlashKernel:
    """aten's flash attention (CUDA, fp16/bf16, no mask): the fastest block kernel."""

    name = "cuda_flash"

    def forward(self, q, k, v, bias, scale):
        if bias is not None:
            raise ValueError("the CUDA flash block kernel takes no mask; select_kernel uses cuda_efficient for masks")
        out, lse, *_ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
        return out, lse.float()

    def backward(self, dout, q, k, v, out, lse, bias, scale):
        empty = torch.empty(0, dtype=torch.int64, device=q.device)     # philox seed/offset: no dropout
        # No cumulative sequence lengths (None, an undefined tensor): the dense kernel. A defined one,
        # even empty, selects the variable-length kernel, which wants int32 offsets.
        return aten._scaled_dot_product_flash_attention_backward(
            dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(), lse.float().contiguous(),
            None, None, q.size(2), k.size(2), 0.0, False, empty, empty, scale=scale)


KERNELS = {k.name: k for k in (MathKernel(), CpuFlashKernel(), CudaEfficientKernel(), CudaFlashKernel())}


def select_kernel(q: Tensor, bias: Optional[Tensor], preferred: str = "auto"):
    """The kernel for one block: ``preferred`` if named, else by device, dtype and mask."""
    if preferred != "auto":
        if preferred not in KERNELS:
            raise ValueError(f"unknown ring block kernel {preferred!r}; known: auto, {', '.join(KERNELS)}")
        return KERNELS[preferred]
    if q.device.type == "cpu":
        return KERNELS["cpu_flash"]
    if q.device.type == "cuda":
        flash_ok = q.dtype in (torch.float16, torch.bfloat16) and q.size(-1) % 8 == 0 and q.size(-1) <= 256
        return KERNELS["cuda_flash"] if bias is None and flash_ok else KERNELS["cuda_efficient"]
    return KERNELS["math"]
