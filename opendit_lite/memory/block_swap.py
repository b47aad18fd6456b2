"""Block swapping: ``N`` of a model's repeated blocks keep their frozen weights in host memory and
borrow device memory only while they run, forward and backward.

    report = apply_block_swap(model, blocks_to_swap=16)
    print(report)            # which blocks, how many bytes live on the host, copies per step
    model.to("cuda")         # the swapped weights stay on the host; everything else moves
    report.swapper.counts    # what was copied: per direction, blocks and bytes, and in which order

What moves, and when
--------------------
A swapped block's *frozen* tensors (parameters that do not train, and buffers) live in host memory,
pinned on CUDA. Its trainable parameters (LoRA adapters) stay on the device, so the optimizer, the
gradient reduction and the EMA never see a swapped tensor. Each use of the block copies its frozen
tensors host -> device on a side stream, and nothing is ever copied back: per training step each
swapped block is fetched twice (its forward; its backward or recomputation), 2 x N block copies,
and zero device -> host copies.

* Forward, block k: its weights were prefetched while the previous swapped block ran; the compute
  stream waits on the copy's event, the block's parameters point at the device copies for the call,
  and the copy of the next swapped block starts. After the call the parameters point at the host
  tensors again and the device copies are dropped (the allocator reuses them once the kernels that
  read them have run: ``record_stream``).
* Backward, block k: the weights are fetched again and the copy of the *previous* swapped block
  (in forward order) starts, so prefetching runs in reverse in backward. A checkpointed block
  recomputes its forward, which runs the forward above (inside backward, prefetching backwards).
  A block that is not checkpointed keeps no device weights between its forward and its backward:
  during its forward a ``saved_tensors_hooks`` pair replaces every tensor autograd saves that lives
  in one of its device copies (a weight, or a view of one) with a reference, and its backward turns
  the reference back into a view of a fresh copy.

The first swapped block of each pass is fetched when reached (nothing before it prefetches it); the
others overlap with the compute of the block before them.

Placement
---------
``model.to(device)`` / ``.to(dtype)`` / ``.cuda()`` after ``apply_block_swap`` keep the swapped tensors
on the host: each swapped block's ``_apply`` runs the model's own conversion on empty stand-ins for
them, reads the device and dtype they were given, casts the host tensors to that dtype (in host
memory) and makes that device the one they are fetched to. So the booster plugin's placement
(DDP's ``model.to(device)``, LowLevelZero's ``module.to(dtype).to(device)``) places the rest of the
model and never materialises the swapped weights on the device. The swapped tensors are listed in
``model._ddp_params_and_buffers_to_ignore`` (DDP neither broadcasts nor checks them; they are frozen).

Trainable weights (a full fine-tune) are not swapped: their gradients and optimizer state live on
the device (or, under Gemini, in its own chunks that it places itself), and copying the weights back
after every update would be the device -> host traffic this design avoids. A block whose parameters
all train has nothing to swap and ``apply_block_swap`` refuses it with a ConfigError that names
the alternatives (LoRA; ZeRO-3 / Gemini's offload for a full fine-tune).

Composition
-----------
* LoRA: adapters stay resident and train; the frozen base (in any precision: ``low_precision.py``
  stores it in FP8 or NF4 first, and the host then holds the low-precision copy) is swapped.
* Activation checkpointing (``opendit_lite.activation_checkpointing``) must wrap the swapped forward,
  so that its recomputation in backward fetches the weights: apply swapping first. The checkpoint
  wrapper tells the swapped forward that it is recomputed (attribute ``recomputed_in_backward``), and
  the swap then installs no hooks of its own in the first forward (checkpointing's hooks drop what
  the block saves). diffusers' own gradient checkpointing (``enable_gradient_checkpointing``) is
  recognised from the model's ``gradient_checkpointing`` flag. CPU offload of the checkpointed
  blocks' inputs is independent of this (activations, not weights).
* Sequence parallelism, kernel swaps: apply them first, so that the swapped tensors are those of
  the final modules; their collectives run inside the block and are untouched.
* ZeRO-1/2 and DDP see the adapters only (the frozen tensors are not in the optimizer); Gemini
  (ZeRO-3) manages placement itself and is not combined with swapping.
* ``torch.compile`` per block: a swapped block's forward repoints its parameters and installs hooks,
  which graph-break; it runs eagerly around the compiled inner forward of resident blocks.

Why not diffusers' group offloading
-----------------------------------
``diffusers.hooks.apply_group_offloading(offload_type="block_level", use_stream=True,
record_stream=True)`` does the forward half of this (pinned host copies, a side stream, ``.data``
repointing, prefetching the next group), and is what its pipelines use for inference. For training
it falls short where this module differs:

1. Its hooks are forward-only. After a block's forward the parameters point at host memory again,
   but autograd still holds what the forward saved: views of the device weights (kept alive until
   backward, so a block that is not checkpointed frees nothing) or the parameter itself (which now
   reads host memory in a device backward). Here the saved weights are replaced by references and
   fetched again in backward.
2. With checkpointing, the recomputation in backward calls the block's forward again; group
   offloading's prefetch chain points forward (each block prefetches the next one in forward
   order), so in backward every block is loaded synchronously and the prefetch loads the wrong
   block. Here the direction follows the pass.
3. Every block of every ``ModuleList`` is offloaded (plus the model's remaining modules as one
   group): there is no "N of M blocks". Here ``blocks_to_swap`` chooses how many, spread over depth.
4. A group moves all of its parameters, trainable ones included: LoRA adapters would point at host
   memory between calls, while their gradients and optimizer state are on the device. Here only
   frozen tensors move.
5. ``model.to(device)`` after applying it moves every weight back to the device (the hooks do not
   intercept placement); the booster plugin places the model after ``parallelize``. Here placement
   leaves the swapped tensors on the host.

Both share the mechanics: host copies made once, parameters repointed with ``.data``, copies on a
side stream with ``record_stream`` for the allocator.
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..models.blocks import blocks_source, find_blocks
from .copies import CopyCounts, SyncCopier, copier_for


def swapped_indices(num_blocks: int, blocks_to_swap: int) -> List[int]:
    """Which blocks to swap: ``blocks_to_swap`` of ``num_blocks``, spread evenly over depth, so that the
    resident blocks between two swapped ones give the next copy more compute to hide behind. Block
    ``floor((j + 1/2) * num_blocks / blocks_to_swap)`` for ``j < blocks_to_swap`` (all blocks when equal)."""
    if not 0 <= blocks_to_swap <= num_blocks:
        raise ValueError(f"blocks_to_swap must be in [0, {num_blocks}], got {blocks_to_swap}")
    return [int((j + 0.5) * num_blocks / blocks_to_swap) for j in range(blocks_to_swap)]


def _in_backward() -> bool:
    """True while autograd's engine runs a backward pass on this thread (checkpoint recomputation)."""
    return torch._C._current_graph_task_id() != -1


class _Slot:
    """One frozen tensor of a swapped block: a parameter (repointed with ``.data``) or a buffer."""

    def __init__(self, module: nn.Module, name: str, is_param: bool, host: torch.Tensor):
        self.module, self.name, self.is_param, self.host = module, name, is_param, host

    def current(self) -> torch.Tensor:
        return self.module._parameters[self.name] if self.is_param else self.module._buffers[self.name]

    def put(self, t: torch.Tensor) -> None:
        if self.is_param:
            self.module._parameters[self.name].data = t
        else:
            self.module._buffers[self.name] = t


class SwappedBlock:
    """One swapped block: its frozen tensors' host copies and the fetch in flight, if any."""

    def __init__(self, index: int, name: str, block: nn.Module, slots: List[_Slot], owner: object = None):
        self.index, self.name, self.block, self.slots = index, name, block, slots
        self.owner = owner   # keeps the host tensors' page-locked buffer registered (StreamCopier)
        self.pending = None  # (copies, event) of a fetch started ahead of use

    def rehost(self, hosts: Sequence[torch.Tensor], owner: object) -> None:
        """Make ``hosts`` the block's host tensors (placement converted or pinned them)."""
        for slot, host in zip(self.slots, hosts):
            slot.host = host
            slot.put(host)
        self.owner = owner
        self.pending = None

    @property
    def nbytes(self) -> int:
        return sum(s.host.numel() * s.host.element_size() for s in self.slots)

    def install(self, copies: Sequence[torch.Tensor]) -> None:
        for slot, t in zip(self.slots, copies):
            slot.put(t)

    def uninstall(self) -> None:
        for slot in self.slots:
            slot.put(slot.host)


class BlockSwapper:
    """The swapped blocks of one model, the device their weights are fetched to, and the copier.

    ``acquire(k)`` returns block k's device copies (waiting for a prefetch, or copying now) and starts
    the copy of the block after it in the current pass (forward: the next, backward: the previous)."""

    def __init__(self, blocks: List[SwappedBlock], device: torch.device,
                 recomputed: Callable[[], bool] = lambda: False):
        self.blocks = blocks
        self.counts = CopyCounts()
        self.recomputed = recomputed  # True while the model's own checkpointing recomputes every block
        self.copier: SyncCopier = copier_for(device, self.counts)

    @property
    def device(self) -> torch.device:
        return self.copier.device

    def _start(self, k: int, direction: str) -> None:
        block = self.blocks[k]
        if block.pending is None:
            block.pending = self.copier.start([s.host for s in block.slots], self.device, (block.index, direction))

    def acquire(self, k: int) -> List[torch.Tensor]:
        direction = "backward" if _in_backward() else "forward"
        self._start(k, direction)
        copies, event = self.blocks[k].pending
        self.blocks[k].pending = None
        neighbour = k + 1 if direction == "forward" else k - 1
        if 0 <= neighbour < len(self.blocks):
            self._start(neighbour, direction)
        return self.copier.finish(copies, event)

    def retarget(self, device: torch.device) -> None:
        """Fetch to ``device`` from now on (the model was moved there); host tensors get pinned for CUDA."""
        device = torch.device(device)
        if device == self.device:
            return
        self.copier = copier_for(device, self.counts)
        for block in self.blocks:
            block.rehost(*self.copier.to_host([slot.host for slot in block.slots]))


class _WeightRef:
    """What autograd keeps, instead of a view of a device copy, for a tensor a swapped block saved;
    ``view`` is the tensor handed back in backward (kept while autograd keeps this reference)."""

    __slots__ = ("saved", "slot", "size", "stride", "offset", "dtype", "view")

    def __init__(self, saved: "_SavedWeights", slot: int, t: torch.Tensor):
        self.saved, self.slot = saved, slot
        self.size, self.stride, self.offset, self.dtype = t.size(), t.stride(), t.storage_offset(), t.dtype
        self.view: Optional[torch.Tensor] = None


class _SavedWeights:
    """The weights one forward call of a non-checkpointed swapped block saved for backward: the block is
    fetched again at the first unpack (when backward reaches it), and the block's copies are dropped
    once every reference has been unpacked (each view stays alive while autograd holds its reference)."""

    def __init__(self, swapper: BlockSwapper, k: int, copies: Sequence[torch.Tensor]):
        self.swapper, self.k = swapper, k
        self.by_storage = {t.untyped_storage().data_ptr(): i for i, t in enumerate(copies) if t.numel()}
        self.devices = [t.device for t in copies]
        self.copies: Optional[List[torch.Tensor]] = None
        self.packed = 0
        self.unpacked = 0  # references unpacked at least once

    def pack(self, t: torch.Tensor):
        try:
            slot = self.by_storage.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # tensors without a storage (subclasses, sparse)
            return t
        if slot is None or t.device != self.devices[slot]:
            return t
        self.packed += 1
        return _WeightRef(self, slot, t)

    def unpack(self, ref):
        if not isinstance(ref, _WeightRef):
            return ref
        if ref.view is not None:  # unpacked before (a node reading its saved tensors twice)
            return ref.view
        if self.copies is None:  # backward reached this block: fetch, and prefetch the one before it
            self.copies = self.swapper.acquire(self.k)
        base = self.copies[ref.slot]
        if base.dtype != ref.dtype:
            base = base.view(ref.dtype)
        ref.view = base.as_strided(ref.size, ref.stride, ref.offset)
        self.unpacked += 1
        if self.unpacked == self.packed:
            self.copies = None  # the views handed out keep their memory until autograd drops them
        return ref.view


class _SwappedForward:
    """A swapped block's ``forward``, installed on the block instance: fetch, run, point back at the host."""

    def __init__(self, forward: Callable, swapper: BlockSwapper, k: int):
        self.forward, self.swapper, self.k = forward, swapper, k
        self.recomputed_in_backward = False  # set by activation checkpointing when it wraps this forward

    @torch.compiler.disable
    def __call__(self, *args, **kwargs):
        block = self.swapper.blocks[self.k]
        copies = self.swapper.acquire(self.k)
        block.install(copies)
        try:
            if (torch.is_grad_enabled() and not _in_backward() and not self.recomputed_in_backward
                    and not self.swapper.recomputed()):
                saved = _SavedWeights(self.swapper, self.k, copies)
                with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                    return self.forward(*args, **kwargs)
            return self.forward(*args, **kwargs)
        finally:
            block.uninstall()


def _placement(block: nn.Module, swapped: SwappedBlock, swapper: BlockSwapper):
    """``block._apply`` that converts the swapped tensors' host copies instead of moving them (see
    "Placement" in the module docstring)."""
    original = block._apply

    def _apply(fn, recurse=True):
        for slot in swapped.slots:
            slot.put(torch.empty(0, dtype=slot.host.dtype))
        try:
            result = original(fn, recurse)
        finally:
            targets = [slot.current() for slot in swapped.slots]
            devices = {t.device for t in targets}
            if len(devices) == 1:
                swapper.retarget(devices.pop())
            if any(t.dtype != slot.host.dtype for slot, t in zip(swapped.slots, targets)):  # cast on the host
                swapped.rehost(*swapper.copier.to_host([slot.host.to(t.dtype) for slot, t in zip(swapped.slots,
                                                                                                   targets)]))
            else:
                swapped.rehost([slot.host for slot in swapped.slots], swapped.owner)
        return result

    return _apply


@dataclass(frozen=True)
class SwapReport:
    """What ``apply_block_swap`` did; ``str()`` is one line for the training log."""

    source: str                      # where the blocks came from
    blocks: Tuple[str, ...]          # qualified names of all blocks
    swapped: Tuple[int, ...]         # indices into ``blocks`` of the swapped ones
    host_bytes: int                  # frozen bytes kept on the host
    resident_trainable: int          # trainable parameters (adapters) left on the device in swapped blocks
    swapper: Optional[BlockSwapper] = None

    def __str__(self) -> str:
        if not self.swapped:
            return "block swapping: off"
        return (f"block swapping: {len(self.swapped)}/{len(self.blocks)} blocks ({self.source}) keep "
                f"{self.host_bytes / 2**30:.2f} GiB of frozen weights in host memory, fetched 2 x "
                f"{len(self.swapped)} times per step (forward; backward or recomputation), never copied back"
                + (f"; {self.resident_trainable / 1e6:.3f}M trainable parameters stay on the device"
                   if self.resident_trainable else ""))


def apply_block_swap(model: nn.Module, blocks_to_swap: int, *,
                     recomputed: Optional[Callable[[], bool]] = None) -> SwapReport:
    """Swap the frozen weights of ``blocks_to_swap`` of ``model``'s blocks (``find_blocks``), in place.

    Apply after LoRA, base-weight precision, kernel swaps and sequence parallelism, before activation
    checkpointing and compile (see the module docstring), once, on the unwrapped model; placement
    (``model.to``) may come before or after. ``recomputed``: whether the model's own checkpointing
    recomputes every block at this moment (default: diffusers' ``gradient_checkpointing`` flag on the
    model). Raises ConfigError when ``blocks_to_swap`` exceeds the blocks or a chosen block has nothing
    frozen to swap (a full fine-tune)."""
    if blocks_to_swap == 0:
        return SwapReport("", (), (), 0, 0)
    try:
        blocks = find_blocks(model)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"memory.blocks_to_swap={blocks_to_swap} swaps repeated blocks, but {e}") from None
    names = {id(m): n for n, m in model.named_modules()}
    if blocks_to_swap > len(blocks):
        raise ConfigError(f"memory.blocks_to_swap={blocks_to_swap} is more than the {len(blocks)} blocks of "
                          f"{type(model).__name__} ({blocks_source(model)}): set it to at most {len(blocks)}.")
    if any(isinstance(vars(b).get("forward"), _SwappedForward) for b in blocks):
        raise RuntimeError(f"block swapping is already applied to {type(model).__name__}; apply it once per model.")
    chosen = swapped_indices(len(blocks), blocks_to_swap)
    for i in chosen:
        trainable = [p for p in blocks[i].parameters() if p.requires_grad]
        if trainable and not any(not p.requires_grad for p in blocks[i].parameters()):
            raise ConfigError(
                f"memory.blocks_to_swap keeps frozen weights in host memory, but every parameter of block "
                f"{names[id(blocks[i])]} trains (a full fine-tune): their gradients and optimizer state live on the "
                f"device. Train LoRA adapters (lora.rank > 0; the frozen base is then swapped), or for a full "
                f"fine-tune use zero_degree=3 (Gemini offloads parameter chunks and optimizer state), or set "
                f"memory.blocks_to_swap=0.")
    device = next((t.device for b in blocks for t in b.parameters()), torch.device("cpu"))
    swapper = BlockSwapper([], device, recomputed or (lambda: bool(getattr(model, "gradient_checkpointing", False))))
    # A tensor also used outside its block (or twice) stays resident: repointing it would move it for
    # every user.
    uses: Dict[int, int] = {}
    for module in model.modules():
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None:
                uses[id(t)] = uses.get(id(t), 0) + 1
    ignore: List[str] = []
    resident = 0
    for k, i in enumerate(chosen):
        block, prefix = blocks[i], names[id(blocks[i])]
        slots, tensors = [], []
        for mod_name, module in block.named_modules():
            entries = [(n, p, True) for n, p in module._parameters.items()]
            entries += [(n, b, False) for n, b in module._buffers.items()]
            for name, t, is_param in entries:
                if t is None:
                    continue
                if (is_param and t.requires_grad) or uses[id(t)] > 1:
                    resident += t.numel() if is_param and t.requires_grad else 0
                    continue
                slots.append(_Slot(module, name, is_param, t))
                tensors.append(t.data if is_param else t)
                ignore.append(".".join(x for x in (prefix, mod_name, name) if x))
        swapped = SwappedBlock(i, prefix, block, slots)
        swapped.rehost(*swapper.copier.to_host(tensors))  # the block's frozen tensors now are the host copies
        swapper.blocks.append(swapped)
        block.forward = _SwappedForward(block.forward, swapper, k)
        block._apply = _placement(block, swapped, swapper)
    model._ddp_params_and_buffers_to_ignore = sorted(set(getattr(model, "_ddp_params_and_buffers_to_ignore", ())
                                                         ) | set(ignore))
    return SwapReport(source=blocks_source(model), blocks=tuple(names[id(b)] for b in blocks), swapped=tuple(chosen),
                      host_bytes=sum(b.nbytes for b in swapper.blocks), resident_trainable=resident, swapper=swapper)


def swapped_blocks(model: nn.Module) -> Dict[str, bool]:
    """Block name -> whether it is swapped, for reports and tests."""
    names = {id(m): n for n, m in model.named_modules()}
    return {names[id(b)]: isinstance(vars(b).get("forward"), _SwappedForward) for b in find_blocks(model)}
