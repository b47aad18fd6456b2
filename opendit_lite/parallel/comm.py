"""Differentiable collectives of sequence parallelism: all-to-all between sequence and head
sharding, and split/gather of a token sequence along one axis with padding.

Gradient convention
-------------------
Data-parallel gradient reduction (DDP and ZeRO alike) averages each parameter's gradient over the
whole world, SP ranks included. Every rank of an SP group holds the same replicated parameters,
gathers the full output and computes the same full loss ``L``. We therefore make each rank's local
gradient the exact gradient of ``sum over the SP group of L`` (= ``sp_size * L``) with respect to
that rank's copy of the parameters. Summed over the SP group these are ``sp_size`` times the serial
gradient, so the plain world mean equals the serial gradient with no extra rescaling anywhere:

* ``split_sequence`` forward pads and keeps this rank's shard of a replicated tensor; backward
  scatters the shard's gradient into a zero tensor of the full size (no communication: each
  rank's copy of the replicated input only feeds that rank's shard).
* ``all_to_all`` is a permutation of data across ranks; its backward is the reverse all-to-all.
* ``gather_sequence`` forward all-gathers the shards and drops the padding; backward
  reduce-scatters with SUM, so each rank receives the gradient of every rank's loss copy with
  respect to its shard. Upstream gradients are normally identical on all SP ranks, making this
  ``sp_size`` times the slice, but the sum stays exact if they differ (e.g. per-rank dropout).

The consequence for per-rank gradients: parameters used after the gather (final layer) get the
serial gradient on every SP rank; parameters used on shards get ``sp_size`` times their shard's
contribution. Only the SP-group mean (hence the world mean) is the serial gradient.

Padding
-------
When the sequence length ``N`` is not a multiple of the SP size ``P``, ``split_sequence`` pads it
to ``ceil(N / P) * P`` before sharding; the padded tokens flow through token-wise layers on the
last ranks, are removed before attention sees them (see ``ulysses.py``) and dropped by
``gather_sequence``.
"""

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F


def group_size(group: Optional[dist.ProcessGroup]) -> int:
    """Ranks in ``group`` (the default group when None); 1 when torch.distributed is not running."""
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def group_rank(group: Optional[dist.ProcessGroup]) -> int:
    """This rank's index inside ``group``; 0 when torch.distributed is not running."""
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def padded_length(length: int, parts: int) -> int:
    """Smallest multiple of ``parts`` that is >= ``length``."""
    return -(-length // parts) * parts


def pad_along(x: torch.Tensor, dim: int, length: int, value: float = 0.0) -> torch.Tensor:
    """Pad ``x`` at the end of ``dim`` up to ``length`` with ``value`` (a no-op when already there)."""
    extra = length - x.size(dim)
    if extra == 0:
        return x
    dim = dim % x.dim()
    # F.pad lists (before, after) pairs starting from the last dimension.
    pads = [0, 0] * (x.dim() - 1 - dim) + [0, extra]
    return F.pad(x, pads, value=value)


# ----------------------------------------------------------------------------------------------
# all-to-all
# ----------------------------------------------------------------------------------------------

def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    parts = group_size(group)
    # Cut scatter_dim into `parts` blocks and put the block index first, so block j is the j-th
    # contiguous slab that all_to_all_single sends to rank j: [P, ..., S/P, ...].
    blocks = x.unflatten(scatter_dim, (parts, -1)).movedim(scatter_dim, 0).contiguous()
    received = torch.empty_like(blocks)
    dist.all_to_all_single(received, blocks, group=group)
    # received[j] is rank j's shard along gather_dim: put the rank index just before gather_dim
    # and merge the two (rank-major), giving the full gather_dim.
    return received.movedim(0, gather_dim).flatten(gather_dim, gather_dim + 1)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        # The reverse exchange routes every gradient element back to where its value came from.
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, group: Optional[dist.ProcessGroup], scatter_dim: int,
               gather_dim: int) -> torch.Tensor:
    """Re-shard ``x`` across ``group``: split ``scatter_dim`` into P blocks (block j goes to rank j)
    and concatenate the blocks received from all ranks along ``gather_dim`` in rank order.

    E.g. ``[B, N/P, H, D] -> [B, N, H/P, D]`` with ``scatter_dim=2, gather_dim=1``, and back with the
    dims swapped. Differentiable; the identity when the group has one rank.
    """
    parts = group_size(group)
    if parts == 1:
        return x
    scatter_dim, gather_dim = scatter_dim % x.dim(), gather_dim % x.dim()
    if scatter_dim == gather_dim:
        raise ValueError(f"all_to_all: scatter_dim and gather_dim must differ, both are {scatter_dim}")
    if x.size(scatter_dim) % parts != 0:
        raise ValueError(
            f"all_to_all: dimension {scatter_dim} of a tensor of shape {tuple(x.shape)} has size "
            f"{x.size(scatter_dim)}, not divisible by the group size {parts}; pad it or pick a group "
            f"size that divides it"
        )
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


def check_replicated(x: torch.Tensor, group: Optional[dist.ProcessGroup], what: str) -> None:
    """Raise if ``x`` is visibly different across ``group``, which should hold identical copies.

    Compares two fingerprints (sum and absolute sum in fp32) gathered from every rank, with a
    relative tolerance that ignores rounding differences of nondeterministic kernels but not
    different data or noise. One small all-gather and a host sync: call it once, not per step.
    """
    x = x.detach().float()
    local = torch.stack([x.sum(), x.abs().sum()])                                # [2]
    every = local.new_empty(group_size(group) * 2)
    dist.all_gather_into_tensor(every, local, group=group)
    every = every.view(-1, 2).cpu()                                             # [P, 2]
    scale = every[:, 1].abs().max().item() + 1e-30
    spread = (every - every[0]).abs().max().item()
    if spread > 1e-3 * scale:
        raise RuntimeError(
            f"the ranks of a sequence-parallel group hold different {what} (fingerprints "
            f"{every.tolist()}): every rank of an SP group must see the same batch, noise, timesteps "
            f"and label dropout. Shard the data over the data-parallel axis only and seed the random "
            f"generators per data-parallel rank, e.g. seed_everything(seed, dp_rank, dp_size)."
        )


# ----------------------------------------------------------------------------------------------
# split / gather along the sequence
# ----------------------------------------------------------------------------------------------

def split_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup], dim: int,
                   pad_value: float = 0.0) -> torch.Tensor:
    """This rank's shard of a tensor that is replicated across ``group``, along ``dim``.

    ``dim`` is first padded with ``pad_value`` to a multiple of the group size P; rank r keeps
    block r of ``ceil(N / P)`` entries. Plain tensor ops, so autograd gives the backward of the
    module docstring: the shard's gradient placed in zeros, padding removed, no communication.
    """
    parts = group_size(group)
    if parts == 1:
        return x
    chunk = padded_length(x.size(dim), parts) // parts
    x = pad_along(x, dim, chunk * parts, pad_value)
    return x.narrow(dim, group_rank(group) * chunk, chunk)


def _all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    parts = group_size(group)
    local = x.movedim(dim, 0).contiguous()                        # [n, ...]
    full = local.new_empty((parts * local.size(0),) + local.shape[1:])
    dist.all_gather_into_tensor(full, local, group=group)         # [P * n, ...], rank-major
    return full.movedim(0, dim)


def _reduce_scatter_sum(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    parts = group_size(group)
    full = x.movedim(dim, 0).contiguous()                         # [P * n, ...]
    local = full.new_empty((full.size(0) // parts,) + full.shape[1:])
    dist.reduce_scatter_tensor(local, full, op=dist.ReduceOp.SUM, group=group)
    return local.movedim(0, dim)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        # Sum of every rank's upstream gradient for this rank's shard: see the module docstring.
        return _reduce_scatter_sum(grad, ctx.group, ctx.dim), None, None


def gather_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup], dim: int,
                    length: Optional[int] = None) -> torch.Tensor:
    """All-gather the shards produced by ``split_sequence`` along ``dim`` and drop the padding,
    keeping the first ``length`` entries (all of them when None). Backward: reduce-scatter SUM.
    """
    parts = group_size(group)
    if parts == 1:
        return x
    dim = dim % x.dim()
    full = _GatherSequence.apply(x, group, dim)
    if length is None or length == full.size(dim):
        return full
    if length > full.size(dim):
        raise ValueError(
            f"gather_sequence: asked to keep {length} entries along dim {dim} but the gathered "
            f"tensor has only {full.size(dim)} ({parts} ranks x {x.size(dim)})"
        )
    return full.narrow(dim, 0, length)


# ----------------------------------------------------------------------------------------------
# collectives outside autograd (masks, partial results whose backward is written by hand)
# ----------------------------------------------------------------------------------------------

def all_gather_stacked(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """``[...] -> [P, ...]``: every rank's ``x`` in group-rank order, outside autograd (bool as uint8)."""
    parts = group_size(group)
    if parts == 1:
        return x.unsqueeze(0)
    payload = (x.to(torch.uint8) if x.dtype == torch.bool else x.detach()).reshape(-1)   # flat: any shape
    every = payload.new_empty(parts * payload.numel())
    dist.all_gather_into_tensor(every, payload.contiguous(), group=group)   # gloo wants the blocks on dim 0
    every = every.view((parts,) + tuple(x.shape))
    return every.bool() if x.dtype == torch.bool else every


def gather_no_grad(x: torch.Tensor, group: Optional[dist.ProcessGroup], dim: int,
                   length: Optional[int] = None) -> torch.Tensor:
    """All-gather the blocks of ``x`` along ``dim`` in rank order and keep the first ``length`` entries,
    outside autograd (e.g. the shards of a key mask)."""
    dim = dim % x.dim()
    full = all_gather_stacked(x, group)                                   # [P, ..., n, ...]
    full = full.movedim(0, dim).flatten(dim, dim + 1)                     # [..., P * n, ...]
    return full if length is None else full.narrow(dim, 0, length)
