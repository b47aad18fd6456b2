"""Checkpointing blocks that contain sequence-parallel all-to-all collectives (2 gloo ranks).

Recomputation re-runs each checkpointed block's collectives during backward. That is correct
when every rank checkpoints the same blocks and recomputes them completely, in the same order;
the test counts the collectives on each rank and compares gradients with the run without
checkpointing.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from tests.distributed import run_distributed

CALLS = {"all_to_all": 0}


class _AllToAll(torch.autograd.Function):
    """all_to_all over dim-0 chunks; it is its own adjoint, so backward is the same exchange."""

    @staticmethod
    def exchange(t):
        CALLS["all_to_all"] += 1
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t.contiguous())
        return out

    @staticmethod
    def forward(ctx, t):
        return _AllToAll.exchange(t)

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.exchange(grad)


class UlyssesBlock(nn.Module):
    """Attention over the full sequence with tokens sharded across ranks, Ulysses-style: swap the
    token shard for a channel shard, attend, swap back."""

    def __init__(self, dim: int, world: int):
        super().__init__()
        self.world = world
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, n_local, D = x.shape
        P, d = self.world, D // self.world

        def gather_tokens(t):                                             # [B, N/P, D] -> [B, N, D/P]
            t = t.reshape(B, n_local, P, d).permute(2, 0, 1, 3)           # [P, B, N/P, D/P]
            t = _AllToAll.apply(t)                                        # chunk p: rank p's tokens
            return t.permute(1, 0, 2, 3).reshape(B, P * n_local, d)

        q, k, v = (gather_tokens(t) for t in self.qkv(x).chunk(3, dim=-1))
        o = torch.softmax(q @ k.transpose(1, 2) / d ** 0.5, dim=-1) @ v  # [B, N, D/P]
        o = o.reshape(B, P, n_local, d).permute(1, 0, 2, 3)              # [P, B, N/P, D/P]
        o = _AllToAll.apply(o)                                           # chunk p: rank p's channels
        o = o.permute(1, 2, 0, 3).reshape(B, n_local, D)                 # [B, N/P, D]
        return x + self.proj(o)


class ShardedModel(nn.Module):
    def __init__(self, depth: int, dim: int, world: int):
        super().__init__()
        self.blocks = nn.ModuleList([UlyssesBlock(dim, world) for _ in range(depth)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _grads_and_collectives(model, x):
    CALLS["all_to_all"] = 0
    x = x.clone().requires_grad_(True)
    model(x * 1.0).square().mean().backward()  # * 1.0: the blocks' input is an activation
    grads = [p.grad for p in model.parameters()] + [x.grad]
    return grads, CALLS["all_to_all"]


def _check_rank(rank, world_size, depth, ratio):
    torch.manual_seed(0)  # same weights on every rank
    model = ShardedModel(depth, dim=8, world=world_size)
    wrapped = copy.deepcopy(model)
    report = apply_activation_checkpointing(wrapped, ratio, offload=True)
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(rank))  # this rank's 3 tokens
    ref, plain_calls = _grads_and_collectives(model, x)
    got, ckpt_calls = _grads_and_collectives(wrapped, x)
    worst = max((a - b).abs().max().item() for a, b in zip(got, ref))
    return worst, plain_calls, ckpt_calls, report.checkpointed


def test_checkpointed_collectives_are_recomputed_in_step():
    depth, ratio = 4, 0.5
    results = run_distributed(_check_rank, 2, args=(depth, ratio))
    per_block = 4  # q, k, v gathered, output scattered back
    for worst, plain_calls, ckpt_calls, checkpointed in results:
        assert worst <= 1e-6, f"gradients differ by {worst:.3e}"
        assert plain_calls == 2 * per_block * depth  # forward and backward
        assert ckpt_calls == plain_calls + per_block * len(checkpointed)  # each recomputed once, in full
    assert results[0][3] == results[1][3] == (0, 2)  # the same blocks on every rank
