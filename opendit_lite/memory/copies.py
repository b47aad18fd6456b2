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
are first placed in host memory and never during a step. On CUDA a block's host tensors are views into
one page-locked buffer of exactly their size (``cudaHostRegister``), not one ``pin_memory()`` each:
PyTorch's pinned allocator rounds each allocation up to a power of two, which for a 14B model's
weights (50 and 140 MB matrices) costs 30-80% more host memory.
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

    def to_host(self, tensors: Sequence[torch.Tensor]) -> Tuple[List[torch.Tensor], object]:
        """One block's tensors in host memory, and an object that must live as long as they do (None here):
        a tensor already there is kept, a device tensor is copied (a counted store)."""
        hosts = []
        for t in tensors:
            if t.device.type != "cpu":
                self.counts.stores += 1
                self.counts.store_bytes += _nbytes([t])
            hosts.append(t.detach().to("cpu"))
        return hosts, None

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

    def to_host(self, tensors: Sequence[torch.Tensor]) -> Tuple[List[torch.Tensor], object]:
        """One block's tensors in page-locked host memory: views into one buffer of exactly their size,
        registered with ``cudaHostRegister``. (``pin_memory()`` per tensor would go through PyTorch's caching
        host allocator, which rounds every allocation up to a power of two: up to twice the host memory.)
        Returns the views and the buffer's owner, which unregisters it when collected."""
        if all(t.device.type == "cpu" and t.is_pinned() for t in tensors):
            return [t.detach() for t in tensors], None
        for t in tensors:
            if t.device.type != "cpu":
                self.counts.stores += 1
                self.counts.store_bytes += _nbytes([t])
        offsets, total = [], 0
        for t in tensors:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        owner = _PageLocked(max(total, _ALIGN))
        hosts = []
        for t, offset in zip(tensors, offsets):
            view = owner.buffer[offset:offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t.detach())
            hosts.append(view)
        return hosts, owner

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


_ALIGN = 256  # bytes: every tensor of a block's buffer starts at a multiple (dtype views need alignment)


class _PageLocked:
    """A host buffer of exactly ``nbytes`` registered as page-locked (``cudaHostRegister``), unregistered
    when this object is collected; falls back to PyTorch's pinned allocator if registration fails."""

    def __init__(self, nbytes: int):
        self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        self.registered = int(torch.cuda.cudart().cudaHostRegister(self.buffer.data_ptr(), nbytes, 0)) == 0
        if not self.registered:
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def __del__(self):
        if getattr(self, "registered", False):
            torch.cuda.cudart().cudaHostUnregister(self.buffer.data_ptr())


def copier_for(device: torch.device, counts: Optional[CopyCounts] = None) -> SyncCopier:
    """The copier for a model that computes on ``device``, counting into ``counts``."""
    device = torch.device(device)
    return StreamCopier(device, counts) if device.type == "cuda" else SyncCopier(device, counts)
