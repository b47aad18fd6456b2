"""Activation offload: the saved inputs of checkpointed blocks wait for backward in pinned CPU memory.

Under activation checkpointing a block keeps only its inputs for backward (everything inside it
is recomputed), so at long sequence lengths the GPU fills with one ``[B, N, D]`` hidden state per
block. ``ActivationOffloader`` moves those inputs to the host during forward and brings each
block's back one block ahead of need during backward:

* forward, block i: a side copy stream waits for the compute stream (which produced block i's
  input) and copies the input to pinned host memory while the compute stream runs block i. The
  input is marked as used by the copy stream (``record_stream``), so once the model drops it the
  caching allocator hands its memory out again only after the copy has read it.
* backward, block i: its recomputation starts by unpacking its inputs. They were prefetched when
  block i+1's recomputation started; the compute stream waits on the copy's event before reading
  them. Unpacking also starts copying block i-1's inputs back, which overlaps with block i's
  recomputation and backward.

How the inputs are found: non-reentrant ``torch.utils.checkpoint`` keeps a block's inputs as
ordinary autograd saved tensors, saved *outside* the hooks it installs around the block's body,
so a ``saved_tensors_hooks`` context around the checkpoint call sees exactly the block's inputs
and nothing from inside the block.

Which inputs move: activations (tensors with a ``grad_fn``), the hidden states that only the
checkpoint keeps alive. Parameters, buffers and constant tables (masks, rotary tables) stay: they
live on the GPU anyway, so a host copy would free nothing. Tensors that are not on a CUDA device
are kept as they are, so on CPU the offloader is a pass-through.

Lifetime: the host copies belong to the autograd graph and are freed with it (after backward, or
when an unused graph is dropped), so nothing accumulates across steps. Freed pinned memory returns
to PyTorch's caching host allocator, which hands it out again next step once the copies that used
it have finished (it records events on the copy stream); that is why no pool is kept here.
"""

import contextlib
import weakref
from typing import Dict, List, Optional, Tuple, Union

import torch


class _CudaCopier:
    """Copies between one CUDA device and pinned host memory on a side stream."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device=device)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        self.stream.wait_stream(torch.cuda.current_stream(t.device))  # t's producer has run
        with torch.cuda.stream(self.stream):
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            host.copy_(t, non_blocking=True)
        t.record_stream(self.stream)  # t's memory is not reused before this copy has read it
        return host

    def start_to_device(self, host: torch.Tensor, device: torch.device) -> Tuple[torch.Tensor, torch.cuda.Event]:
        with torch.cuda.stream(self.stream):
            t = torch.empty(host.shape, dtype=host.dtype, device=device)
            t.copy_(host, non_blocking=True)
        return t, self.stream.record_event()

    def finish_to_device(self, t: torch.Tensor, event: torch.cuda.Event) -> torch.Tensor:
        compute = torch.cuda.current_stream(t.device)
        compute.wait_event(event)  # the copy has landed before any kernel reads t
        t.record_stream(compute)   # allocated on the copy stream, used and freed on this one
        return t


def _copier_for_device(device: torch.device) -> Optional[_CudaCopier]:
    """The copier for tensors on ``device``; None keeps them in place (CPU and other devices)."""
    return _CudaCopier(device) if device.type == "cuda" else None


class _BlockInputs:
    """The offloaded inputs of one checkpointed block call, and the hooks that save and restore them.

    ``previous`` is the block call before this one in forward, whose inputs backward needs next.
    """

    def __init__(self, offloader: "ActivationOffloader", previous: Optional["_BlockInputs"]):
        self.offloader = offloader
        self.previous = previous
        self.saved: List[Tuple[torch.Tensor, torch.device, _CudaCopier]] = []  # host copy per offloaded input
        self.in_flight: Dict[int, Tuple[torch.Tensor, torch.cuda.Event]] = {}  # copied back, not yet unpacked
        self.num_packed = 0    # inputs saved, offloaded or kept
        self.num_unpacked = 0  # inputs restored, over all backward passes through this call

    def pack(self, t: torch.Tensor) -> Union[torch.Tensor, int]:
        self.num_packed += 1
        copier = self.offloader.copier_for(t.device) if t.grad_fn is not None else None
        if copier is None:
            return t  # kept as autograd would keep it
        self.saved.append((copier.to_host(t), t.device, copier))
        return len(self.saved) - 1

    def prefetch(self) -> None:
        """Start copying this block call's inputs back to their devices, unless already under way."""
        if not self.in_flight:
            self.in_flight = {i: copier.start_to_device(host, device)
                              for i, (host, device, copier) in enumerate(self.saved)}

    def unpack(self, packed: Union[torch.Tensor, int]) -> torch.Tensor:
        # Recomputation restores all of a call's inputs at once, in the order they were saved.
        if self.num_unpacked % self.num_packed == 0:  # the first one: backward has reached this call
            self.prefetch()  # a no-op unless this is the first call in backward (or a repeated backward)
            if self.previous is not None:
                self.previous.prefetch()  # overlaps with this call's recomputation and backward
        self.num_unpacked += 1
        if isinstance(packed, torch.Tensor):
            return packed
        t, event = self.in_flight.pop(packed)
        return self.saved[packed][2].finish_to_device(t, event)


class ActivationOffloader:
    """Offloads the saved inputs of checkpointed blocks; one instance serves all blocks of a model.

    Each checkpointed block call runs inside ``saving_inputs()``. Block calls are chained in
    forward order so that backward can prefetch the next block's inputs; a chain ends when
    backward reaches its last call or its graph is freed, so a new step starts a new chain.
    """

    def __init__(self):
        self._copiers: Dict[torch.device, Optional[_CudaCopier]] = {}
        self._latest: Optional[weakref.ReferenceType] = None  # the latest block call in forward

    def copier_for(self, device: torch.device) -> Optional[_CudaCopier]:
        if device not in self._copiers:
            self._copiers[device] = _copier_for_device(device)
        return self._copiers[device]

    @contextlib.contextmanager
    def saving_inputs(self):
        """Offload the tensors that autograd saves in this context: a checkpointed block's inputs."""
        previous = self._latest() if self._latest is not None else None
        if previous is not None and previous.num_unpacked:
            previous = None  # that graph has been through backward; this is a new step
        block = _BlockInputs(self, previous)
        self._latest = weakref.ref(block)
        with torch.autograd.graph.saved_tensors_hooks(block.pack, block.unpack):
            yield

    def __deepcopy__(self, memo) -> "ActivationOffloader":
        # Streams cannot be copied and the chain belongs to this model's graph: a copy of the
        # model (an EMA model, say) starts with a fresh offloader, shared by all its blocks.
        return ActivationOffloader()
