"""Small models with the block layouts that activation checkpointing must find and wrap.

* ``ToyDiT``: DiT-like, blocks in a ModuleList, called with the conditioning by keyword.
* ``DeclaredToyDiT``: the same, declaring its blocks with ``get_fsdp_wrap_module_list``.
* ``NestedBlocksModel``: blocks in a ModuleList inside a submodule (``transformer.blocks``).
* ``SpatialTemporalModel``: STDiT-like, two interleaved ModuleLists of one block class, next to
  a ModuleList of more (but small) per-frame embedders that must not win the detection.
* ``SequentialModel``: blocks kept in an nn.Sequential, each taking only ``x``.
* ``UserModel``: an arbitrary model whose blocks contain a same-class ModuleList of their own
  and sit beside a longer list of output heads; only its ``layers`` are blocks.
* ``SingleBlockModel``: nothing repeated.

and the gradient comparison the tests share (``grads_of``, ``assert_same_grads``).
"""

import torch
import torch.nn as nn

from opendit_lite.models.layers import Attention, LayerNormModulate


class ToyBlock(nn.Module):
    """adaLN block: attention and MLP branches, gated by the conditioning; dropout in the MLP so
    that checkpointing must replay the random state to reproduce gradients."""

    def __init__(self, dim: int, heads: int = 2):
        super().__init__()
        self.norm1 = LayerNormModulate(dim)
        self.attn = Attention(dim, num_heads=heads)
        self.norm2 = LayerNormModulate(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * dim, dim))
        self.ada = nn.Linear(dim, 6 * dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        # x: [B, N, D]; c: [B, D]
        s1, sc1, g1, s2, sc2, g2 = self.ada(c).chunk(6, dim=-1)                 # 6 x [B, D]
        x = x + g1.unsqueeze(1) * self.attn(self.norm1(x, s1, sc1))            # [B, N, D]
        return x + g2.unsqueeze(1) * self.mlp(self.norm2(x, s2, sc2))          # [B, N, D]


class ToyDiT(nn.Module):
    def __init__(self, depth: int = 8, dim: int = 16, in_dim: int = 4):
        super().__init__()
        self.embed = nn.Linear(in_dim, dim)
        self.cond = nn.Linear(in_dim, dim)
        self.blocks = nn.ModuleList([ToyBlock(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, in_dim)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # x: [B, N, in_dim]; y: [B, in_dim]
        h, c = self.embed(x), self.cond(y)   # [B, N, D], [B, D]
        for block in self.blocks:
            h = block(h, c=c)
        return self.head(h)                  # [B, N, in_dim]


class DeclaredToyDiT(ToyDiT):
    def get_fsdp_wrap_module_list(self):
        return list(self.blocks)


class _Transformer(nn.Module):
    def __init__(self, depth: int, dim: int):
        super().__init__()
        self.blocks = nn.ModuleList([ToyBlock(dim) for _ in range(depth)])


class NestedBlocksModel(ToyDiT):
    def __init__(self, depth: int = 6, dim: int = 16, in_dim: int = 4):
        super().__init__(depth=0, dim=dim, in_dim=in_dim)
        del self.blocks
        self.transformer = _Transformer(depth, dim)

    def forward(self, x, y):
        h, c = self.embed(x), self.cond(y)
        for block in self.transformer.blocks:
            h = block(h, c)
        return self.head(h)


class SpatialTemporalModel(nn.Module):
    """x: [B, T, S, in_dim]; spatial blocks mix within a frame, temporal blocks across frames."""

    def __init__(self, depth: int = 4, dim: int = 16, in_dim: int = 4, frames: int = 9):
        super().__init__()
        self.frames = frames
        self.frame_embedders = nn.ModuleList([nn.Linear(in_dim, dim) for _ in range(frames)])
        self.cond = nn.Linear(in_dim, dim)
        self.spatial_blocks = nn.ModuleList([ToyBlock(dim) for _ in range(depth)])
        self.temporal_blocks = nn.ModuleList([ToyBlock(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, in_dim)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        B, T, S, _ = x.shape
        h = torch.stack([emb(x[:, t]) for t, emb in enumerate(self.frame_embedders)], dim=1)  # [B, T, S, D]
        c = self.cond(y)                                                                       # [B, D]
        c_frames = c.repeat_interleave(T, dim=0)                                               # [B*T, D]
        c_tokens = c.repeat_interleave(S, dim=0)                                               # [B*S, D]
        for spatial, temporal in zip(self.spatial_blocks, self.temporal_blocks):
            h = spatial(h.reshape(B * T, S, -1), c_frames).reshape(B, T, S, -1)
            h = h.transpose(1, 2).reshape(B * S, T, -1)                                        # [B*S, T, D]
            h = temporal(h, c_tokens).reshape(B, S, T, -1).transpose(1, 2)                     # [B, T, S, D]
        return self.head(h)


class MLPBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class SequentialModel(nn.Module):
    def __init__(self, depth: int = 5, dim: int = 16, in_dim: int = 4):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(in_dim, dim), nn.SiLU())
        self.body = nn.Sequential(*[MLPBlock(dim) for _ in range(depth)])
        self.out = nn.Linear(dim, in_dim)

    def forward(self, x, y=None):
        return self.out(self.body(self.stem(x)))


class UserLayer(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.mix = nn.ModuleList([nn.Linear(dim, dim), nn.Linear(dim, dim)])
        self.gate = nn.Linear(dim, dim)

    def forward(self, x, scale: float = 1.0):
        for lin in self.mix:
            x = x + scale * torch.tanh(lin(x))
        return x * torch.sigmoid(self.gate(x))


class UserModel(nn.Module):
    def __init__(self, depth: int = 4, dim: int = 16, in_dim: int = 4, heads: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(in_dim, dim), nn.SiLU())
        self.layers = nn.ModuleList([UserLayer(dim) for _ in range(depth)])
        self.heads = nn.ModuleList([nn.Linear(dim, 1) for _ in range(heads)])

    def forward(self, x, y=None):
        h = self.stem(x)
        for layer in self.layers:
            h = layer(h, scale=0.5)
        return torch.cat([head(h) for head in self.heads], dim=-1)


class SingleBlockModel(nn.Module):
    def __init__(self, dim: int = 16, in_dim: int = 4):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(in_dim, dim), nn.SiLU(), nn.Linear(dim, in_dim))

    def forward(self, x, y=None):
        return self.stem(x)


def toy_inputs(model: nn.Module, batch: int = 2, tokens: int = 6, in_dim: int = 4, seed: int = 0, device="cpu"):
    """Inputs for any toy model above: x (requires grad, to check its gradient too) and y."""
    g = torch.Generator().manual_seed(seed)
    frames = (model.frames,) if isinstance(model, SpatialTemporalModel) else ()
    shape = (batch, *frames, tokens, in_dim)
    x = torch.randn(shape, generator=g).to(device).requires_grad_(True)
    y = torch.randn(batch, in_dim, generator=g).to(device)
    return x, y


def grads_of(model, x, y, seed=1):
    """Loss gradients w.r.t. every parameter and the input, under a fixed dropout seed."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    torch.manual_seed(seed)
    out = model(x, y)
    out.square().mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    grads["<input>"] = x.grad.clone()
    return out.detach(), grads


def assert_same_grads(actual, expected, atol=1e-6):
    assert actual.keys() == expected.keys()
    worst = max(((a - expected[k]).abs().max().item(), k) for k, a in actual.items())
    assert worst[0] <= atol, f"gradient of {worst[1]} differs by {worst[0]:.3e} (> {atol:.0e})"
