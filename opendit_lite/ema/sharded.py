"""Sharded exponential moving average of the trainable weights, fp32, 4 bytes x params / ranks per rank.

Each rank keeps only the slice of the EMA that matches the slice of fp32 weights it already owns,
so an update is a local ``ema += (1 - decay) * (weights - ema)`` over that slice: no
communication and no gather per step. The partition is that of the optimizer's master weights:

- ZeRO-1/2 (LowLevelZero): each parameter is flattened, zero-padded to a multiple of the group
  size and split evenly; the EMA slice is updated from the master shard the optimizer just
  stepped (found through its working-to-master map).
- Gemini (ZeRO-3): each fp32 chunk is split evenly; the EMA slice follows the chunk shard.
- DDP, where every rank holds all weights: all trainable parameters laid end to end form one flat
  vector, split evenly over the ranks; each rank averages its slice of the (fp32) weights.

The common description is a list of *flat runs*: parameters laid end to end, padded to a multiple
of the group size, rank ``r`` holding elements ``[r * n / W, (r + 1) * n / W)`` of each run. The
local shard is the concatenation of this rank's slice of every run, the same length on every rank,
so saving is a chunked all-gather of one tensor and loading (from a full state dict, at any world
size) is a slice per run.
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from colossalai.utils.common import is_ddp_ignored
from colossalai.zero import GeminiDDP, LowLevelZeroOptimizer
from torch.distributed import ProcessGroup

from ..distributed.ranks import collective_device

NamedParams = Sequence[Tuple[str, nn.Parameter]]

# Elements gathered per all-gather when saving: bounds the temporary device buffer to 256 MiB.
_GATHER_NUMEL = 64 * 2**20


@dataclass(frozen=True)
class FlatRun:
    """Parameters laid end to end: padded length ``numel`` (a multiple of the group size) and
    ``(name, offset, shape)`` of each parameter in it."""

    numel: int
    params: Tuple[Tuple[str, int, torch.Size], ...]


@dataclass(frozen=True)
class EMALayout:
    """How this rank's EMA shard maps onto the model, built per strategy by the ``*_layout`` functions.

    runs: the partition, identical on every rank.
    spans: ``(offset, length)`` in the local shard of each slice that has a live source.
    read: returns the current source tensors, 1-D and one per span (fp32 master slices).
    device: where the shard is kept (that of the sources).
    tracked: ``id(parameter) -> name`` of every parameter the EMA averages.
    """

    runs: Tuple[FlatRun, ...]
    spans: Tuple[Tuple[int, int], ...]
    read: Callable[[], List[torch.Tensor]]
    device: torch.device
    tracked: Dict[int, str]


def flat_layout(named_params: NamedParams, group_size: int, group_rank: int) -> EMALayout:
    """DDP: one run of all parameters, this rank owning ``ceil(total / group_size)`` elements of it."""
    offsets, total = [], 0
    for _, p in named_params:
        offsets.append(total)
        total += p.numel()
    shard_len = -(-total // group_size)
    start, end = group_rank * shard_len, (group_rank + 1) * shard_len
    spans, slices = [], []  # slices: (param, begin, end) in the parameter's flat index
    for (_, p), off in zip(named_params, offsets):
        lo, hi = max(off, start), min(off + p.numel(), end)
        if lo < hi:
            spans.append((lo - start, hi - lo))
            slices.append((p, lo - off, hi - off))
    run = FlatRun(shard_len * group_size, tuple((name, off, p.shape) for (name, p), off in zip(named_params, offsets)))
    device = named_params[0][1].device if named_params else torch.device("cpu")
    return EMALayout(
        runs=(run,), spans=tuple(spans), device=device,
        read=lambda: [p.detach().reshape(-1)[a:b] for p, a, b in slices],
        tracked={id(p): name for name, p in named_params},
    )


def zero_layout(named_params: NamedParams, optimizer: LowLevelZeroOptimizer, group_size: int) -> EMALayout:
    """ZeRO-1/2: one run per parameter, the slice being the optimizer's fp32 master shard.

    ``named_params``: the parameters the optimizer updates (those with a master shard).
    """
    masters = optimizer.get_working_to_master_map()
    runs, spans, offset = [], [], 0
    for name, p in named_params:
        shard = masters[id(p)]
        runs.append(FlatRun(shard.numel() * group_size, ((name, 0, p.shape),)))
        spans.append((offset, shard.numel()))
        offset += shard.numel()
    device = masters[id(named_params[0][1])].device if named_params else torch.device("cpu")
    return EMALayout(
        runs=tuple(runs), spans=tuple(spans), device=device,
        read=lambda: [masters[id(p)] for _, p in named_params],
        tracked={id(p): name for name, p in named_params},
    )


def gemini_layout(model: GeminiDDP, group_size: int, group_rank: int) -> EMALayout:
    """ZeRO-3: one run per chunk, the slice being this rank's shard of the fp32 (master) chunk.

    Chunks that Gemini keeps gathered (small models) hold the full fp32 chunk on every rank; the
    EMA still keeps only this rank's ``1 / group_size`` of it.
    """
    manager = model.chunk_manager
    chunk_params: Dict[object, List[Tuple[str, int, torch.Size]]] = {}  # insertion-ordered
    tracked = {}
    for name, p in model.unwrap().named_parameters():
        if is_ddp_ignored(p):  # frozen: Gemini keeps it whole, outside the chunks
            continue
        chunk = manager.get_chunk(p)
        chunk_params.setdefault(chunk, []).append((name, chunk.tensors_info[p].offset, p.shape))
        tracked[id(p)] = name
    runs, spans, sources, offset = [], [], [], 0  # sources: (fp32 chunk, begin, end) or whole shard
    for chunk, params in chunk_params.items():
        master = chunk.paired_chunk
        if master is None:
            raise ValueError("the EMA follows Gemini's fp32 master chunks; build GeminiDDP with master_weights=True")
        chunk_size = int(chunk.chunk_size)  # Gemini's chunk search may hand back a numpy integer
        shard_len = -(-chunk_size // group_size)
        if master.keep_gathered:
            lo, hi = group_rank * shard_len, min((group_rank + 1) * shard_len, chunk_size)
            sources.append((master, lo, max(lo, hi)))
            spans.append((offset, max(0, hi - lo)))
        else:  # the chunk size is a multiple of the group size and the payload is this rank's shard
            sources.append((master, None, None))
            spans.append((offset, shard_len))
        runs.append(FlatRun(shard_len * group_size, tuple(params)))
        offset += shard_len
    # Offloaded master chunks (static placement with offload fractions) take the EMA with them.
    on_cpu = any(m.payload.device.type == "cpu" for m, _, _ in sources)
    device = torch.device("cpu") if on_cpu or not sources else sources[0][0].payload.device

    def read() -> List[torch.Tensor]:
        # Read ``payload`` every time: Gemini may move a shard between CPU and GPU.
        return [m.payload if lo is None else m.payload[lo:hi] for m, lo, hi in sources]

    return EMALayout(runs=tuple(runs), spans=tuple(spans), read=read, device=device, tracked=tracked)


class ShardedEMA:
    """This rank's fp32 EMA shard of ``module``'s tracked parameters, and its gather / load.

    Starts as a copy of the current weights. ``group``: the ranks the EMA is sharded over (those of
    the master weights); ranks outside it (other nodes under grouped ZeRO) hold replicas.
    """

    def __init__(self, layout: EMALayout, group: ProcessGroup, module: nn.Module) -> None:
        self.layout = layout
        self.group = group
        self.module = module
        self.group_size, self.group_rank = dist.get_world_size(group), dist.get_rank(group)
        bad = [run.numel for run in layout.runs if run.numel % self.group_size]
        if bad:
            raise ValueError(f"EMA runs of {bad} elements do not split over {self.group_size} ranks")
        self._run_offsets = []
        numel = 0
        for run in layout.runs:
            self._run_offsets.append(numel)
            numel += run.numel // self.group_size
        self.shard = torch.zeros(numel, dtype=torch.float32, device=layout.device)
        self._pieces = [self.shard.narrow(0, off, n) for off, n in layout.spans]
        self.reset()

    def _sources(self) -> List[torch.Tensor]:
        return [s.detach().to(self.shard.device, torch.float32) for s in self.layout.read()]

    @torch.no_grad()
    def reset(self) -> None:
        """Make this rank's slice equal to the current weights (in place: an optimizer that updates
        the EMA in its step keeps the same pieces)."""
        for piece, src in zip(self._pieces, self._sources()):
            piece.copy_(src)

    def numel_local(self) -> int:
        """Elements of EMA held by this rank (times 4 for bytes)."""
        return self.shard.numel()

    def pieces_and_sources(self) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """The EMA pieces and the fp32 tensors they average, for an optimizer that updates the EMA
        in its own step; the sources must be the very tensors it updates (DDP's fp32 parameters,
        ZeRO's master shards), not copies."""
        sources = [s.detach() for s in self.layout.read()]
        if any(s.dtype != torch.float32 or s.device != self.shard.device for s in sources):
            raise ValueError("an in-step EMA update needs fp32 weights on the EMA's device (DDP's parameters "
                             "or ZeRO's master shards)")
        return list(self._pieces), sources

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """``ema = decay * ema + (1 - decay) * weights`` on this rank's slice (one fused launch)."""
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
        if self._pieces:
            torch._foreach_lerp_(self._pieces, self._sources(), 1.0 - decay)

    @torch.no_grad()
    def _gather_runs(self, keep: bool) -> List[Optional[torch.Tensor]]:
        """All-gather the shards in bounded pieces; each run comes back as a CPU [W, n / W] tensor."""
        size = self.group_size
        fulls = [torch.empty(size, run.numel // size) if keep else None for run in self.layout.runs]
        total, step = self.shard.numel(), max(1, _GATHER_NUMEL // size)
        # A shard kept in CPU memory (offloaded Gemini chunks) travels through the GPU when the group
        # is NCCL-only: NCCL has no CPU backend.
        device = self.shard.device
        if device.type == "cpu":
            device = collective_device(self.group)
        run_idx = 0
        for a in range(0, total, step):
            b = min(total, a + step)
            out = torch.empty(size * (b - a), dtype=self.shard.dtype, device=device)
            dist.all_gather_into_tensor(out, self.shard[a:b].to(device).contiguous(), group=self.group)
            if not keep:
                continue
            out = out.view(size, b - a).cpu()  # row r: elements [a, b) of rank r's shard
            while run_idx < len(fulls):
                off = self._run_offsets[run_idx]
                width = fulls[run_idx].shape[1]
                lo, hi = max(a, off), min(b, off + width)
                if lo < hi:
                    fulls[run_idx][:, lo - off:hi - off] = out[:, lo - a:hi - a]
                if off + width > b:  # this run continues in the next piece
                    break
                run_idx += 1
        return fulls

    def state_dict(self, only_rank_0: bool = False) -> Dict[str, torch.Tensor]:
        """The full EMA as a state dict of ``module`` (a collective: every rank of the group calls it).

        Keys and order are those of ``module.state_dict()``: tracked parameters carry the fp32 EMA;
        the other entries (frozen parameters, buffers) are copied from the module as they are now,
        floating ones as fp32, so the result loads into a fresh model with ``strict=True``.
        With ``only_rank_0`` ranks other than global rank 0 return ``{}`` and keep no full copy.
        """
        keep = not only_rank_0 or dist.get_rank() == 0
        fulls = self._gather_runs(keep)
        if not keep:
            return {}
        ema: Dict[str, torch.Tensor] = {}
        for run, full in zip(self.layout.runs, fulls):
            flat = full.view(-1)
            for name, off, shape in run.params:
                ema[name] = flat[off:off + shape.numel()].view(shape).clone()
        out = {}
        for key, value in self.module.state_dict(keep_vars=True).items():
            name = self.layout.tracked.get(id(value))
            if name is not None:
                out[key] = ema[name]
            else:
                value = value.detach().cpu()
                out[key] = value.float() if value.is_floating_point() else value.clone()
        return out

    @torch.no_grad()
    def load_state_dict(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Load this rank's slice from a full EMA state dict (from any world size or strategy).

        Entries that the EMA does not track (frozen parameters, buffers) are ignored.
        """
        names = [name for run in self.layout.runs for name, _, _ in run.params]
        missing = [name for name in names if name not in state_dict]
        if missing:
            raise KeyError(
                f"EMA state dict lacks {len(missing)} of the {len(names)} averaged parameters "
                f"(first: {missing[:3]}); it was saved from a different model"
            )
        size, rank = self.group_size, self.group_rank
        for run, off in zip(self.layout.runs, self._run_offsets):
            full = torch.zeros(run.numel, dtype=torch.float32)
            for name, start, shape in run.params:
                value = state_dict[name]
                if value.shape != shape:
                    raise ValueError(f"EMA entry {name!r} has shape {tuple(value.shape)}, the model's is "
                                     f"{tuple(shape)}")
                full[start:start + shape.numel()] = value.reshape(-1)
            width = run.numel // size
            self.shard[off:off + width].copy_(full[rank * width:(rank + 1) * width])
