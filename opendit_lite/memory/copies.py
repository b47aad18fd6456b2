"""Host <-> device copies of a block's frozen weights, and a count of every copy made.

Block swapping (``block_swap.py``) keeps a block's frozen tensors in host memory and copies them to
the device ahead of use. The copies go through a *copier*, chosen by the device the model runs on:

* ``StreamCopier`` (CUDA): host tensors in pinned (page-locked) memory, so that the copy is a DMA
  that does not block the host; each block's copies are queued on one side stream and an event
  recorded after them. The compute stream waits on that event right before the block runs (not
  the host: ``finish`` returns at once), and each device tensor is marked as used by the compute
  stream (``record_stream``), so that once the block drops it the caching allocator reuses its
  memory only after the kernels that read it have run.
* ``SyncCopier`` (any other device, CPU included): plain synchronous copies into fresh tensors. On
  the CPU "host" and "device" are the same memory, but the copies are real (new storage each time),
  so tests see exactly which tensors a block computed with and can count them.

Every copier counts what it moved in a ``CopyCounts``: per direction, the block transfers and the
bytes, and the order of the transfers (block index, "forward"/"backward"). Frozen weights only ever
travel host -> device once they are set up; ``to_host`` (device -> host) runs when a block's weights
are first placed in host memory and never during a step.
"""

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch


@dataclass
class CopyCounts:
    """What a copier moved. ``fetches``/``fetch_bytes``: block transfers host -> device and their bytes;
    ``stores``/``store_bytes``: device -> host (setup only, for frozen weights); ``order``: (block index,
    "forward" or "backward") of each fetch, in the order the fetches were started."""

    fetches: int = 0
    fetch_bytes: int = 0
    stores: int = 0
    store_bytes: int = 0
    order: List[Tuple[int, str]] = field(default_factory=list)

    def reset(self) -> None:
        self.fetches = self.fetch_bytes = self.stores = self.store_bytes = 0
        self.order.clear()


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class SyncCopier:
    """Synchronous copies into fresh tensors, for every device but CUDA (on the CPU: real copies in
    the same memory, which is what the CPU tests count)."""

    def __init__(self, device: torch.device, counts: Optional[CopyCounts] = None):
        self.device = torch.device(device)
        self.counts = counts if counts is not None else CopyCounts()

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in host memory: ``t`` itself when it is there already, else a copy (counted as a store)."""
        if t.device.type == "cpu":
            return t.detach()
        self.counts.stores += 1
        self.counts.store_bytes += _nbytes([t])
        return t.detach().to("cpu")

    def start(self, host: Sequence[torch.Tensor], device: torch.device, tag: Tuple[int, str]):
        """Begin copying ``host`` to ``device``; ``tag`` is what ``counts.order`` records."""
        self.counts.fetches += 1
        self.counts.fetch_bytes += _nbytes(host)
        self.counts.order.append(tag)
        return [h.to(device, copy=True) for h in host], None

    def finish(self, copies: List[torch.Tensor], event) -> List[torch.Tensor]:
        """The device tensors of ``start``, ready for the current stream."""
        return copies


class StreamCopier(SyncCopier):
    """CUDA: pinned host tensors, copies on a side stream, the compute stream waiting on an event."""

    def __init__(self, device: torch.device, counts: Optional[CopyCounts] = None):
        super().__init__(device, counts)
        self.stream = torch.cuda.Stream(device=self.device)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in pinned host memory (a pinned tensor is kept; a device tensor is a counted store)."""
        if t.device.type == "cpu" and t.is_pinned():
            return t.detach()
        if t.device.type != "cpu":
            self.counts.stores += 1
            self.counts.store_bytes += _nbytes([t])
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        host.copy_(t.detach())
        return host

    def start(self, host: Sequence[torch.Tensor], device: torch.device, tag: Tuple[int, str]):
        self.counts.fetches += 1
        self.counts.fetch_bytes += _nbytes(host)
        self.counts.order.append(tag)
        with torch.cuda.stream(self.stream):
            copies = [h.to(device, non_blocking=True) for h in host]
        return copies, self.stream.record_event()

    def finish(self, copies: List[torch.Tensor], event) -> List[torch.Tensor]:
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(event)  # the copies have landed before any kernel reads them
        for t in copies:
            t.record_stream(compute)  # allocated on the side stream, read and freed on this one
        return copies


def copier_for(device: torch.device, counts: Optional[CopyCounts] = None) -> SyncCopier:
    """The copier for a model that computes on ``device``, counting into ``counts``."""
    device = torch.device(device)
    return StreamCopier(device, counts) if device.type == "cuda" else SyncCopier(device, counts)
