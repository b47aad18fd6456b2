"""Selective activation checkpointing of a model's repeated blocks, with optional CPU offload.

``apply_activation_checkpointing(model, selective_ratio, offload)`` finds the blocks
(``find_checkpoint_blocks``), picks the ones to checkpoint (``select_blocks``) and replaces each
chosen block's ``forward`` with one that runs the original under non-reentrant
``torch.utils.checkpoint``. The replacement is an instance attribute, not a wrapper module, so
parameter names and state-dict keys are unchanged and checkpoints load either way.

Why this composes with the rest of the stack:

* ZeRO-1/2 and DDP reduce gradients from per-parameter hooks; non-reentrant checkpointing
  accumulates each parameter's gradient once per backward, as without it.
* ZeRO-3 (Gemini) gathers parameters around each op with a pre-op/post-op pair. Checkpoint's
  "early stop" would abort the recomputation inside an op, between the two, so it is turned off:
  the recomputation always runs the whole block.
* Sequence parallelism puts all-to-all collectives inside the blocks. Recomputation runs them
  again, in backward order, which is the same on every rank because every rank checkpoints the
  same blocks (the choice depends only on the model structure and the ratio).
* Block swapping (``opendit_lite.memory.block_swap``) replaces a block's ``forward`` before this
  wraps it, so that recomputation fetches the block's weights again; a wrapped forward that has a
  ``recomputed_in_backward`` attribute is told so (it then keeps no weights for backward itself).
* Conversions that swap submodules inside a block (attention backends, the Ulysses op) may run
  before or after this: the original forward looks its submodules up when it runs.
* diffusers' transformers checkpoint their blocks themselves once ``enable_gradient_checkpointing()``
  was called (each block through diffusers' own ``torch.utils.checkpoint`` call, inside the
  model's forward). Both at once would checkpoint every chosen block twice and undo the selective
  ratio, so this turns diffusers' off (``disable_gradient_checkpointing()``) and says so in the
  report; callers print it.
"""

import contextlib
import copy
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from ..models.blocks import blocks_source
from .block_selection import find_checkpoint_blocks, select_blocks
from .offload import ActivationOffloader


@dataclass(frozen=True)
class CheckpointReport:
    """What ``apply_activation_checkpointing`` did; ``str()`` gives one line for the training log."""

    source: str                    # where the blocks came from
    blocks: Tuple[str, ...]        # qualified names of all blocks, in order
    checkpointed: Tuple[int, ...]  # indices into ``blocks`` of the checkpointed ones
    offload: bool                  # checkpointed blocks' inputs wait for backward in CPU memory
    disabled_builtin: bool = False  # the model's own (diffusers') gradient checkpointing was on and turned off

    @property
    def checkpointed_names(self) -> Tuple[str, ...]:
        return tuple(self.blocks[i] for i in self.checkpointed)

    def __str__(self) -> str:
        chosen = set(self.checkpointed)
        kept = [name for i, name in enumerate(self.blocks) if i not in chosen]
        return (f"activation checkpointing: {len(chosen)}/{len(self.blocks)} blocks ({self.source})"
                f"{', inputs offloaded to CPU' if self.offload else ''}; "
                f"not checkpointed: {', '.join(kept) if kept else 'none'}"
                f"{'; ' + BUILTIN_DISABLED if self.disabled_builtin else ''}")


BUILTIN_DISABLED = ("the model's own gradient checkpointing (diffusers' enable_gradient_checkpointing) was on and "
                    "is turned off, so that no block is checkpointed twice")


def builtin_checkpointing_on(model: nn.Module) -> bool:
    """Whether diffusers' own gradient checkpointing is switched on for ``model`` (its ModelMixin API:
    ``is_gradient_checkpointing`` and ``disable_gradient_checkpointing``)."""
    return (bool(getattr(model, "is_gradient_checkpointing", False))
            and callable(getattr(model, "disable_gradient_checkpointing", None)))


class _CheckpointedForward:
    """A block's ``forward`` run under non-reentrant checkpointing, installed on the block instance.

    Arguments are flattened to a list of leaves before they reach ``checkpoint``, so tensors passed
    by keyword or inside lists become positional inputs that checkpoint saves as autograd saved
    tensors, where the offloader sees them, instead of keeping them in a closure.
    """

    def __init__(self, block: nn.Module, forward: Callable, offloader: Optional[ActivationOffloader]):
        # The block holds this object; holding the block back through its bound ``forward`` would be a
        # reference cycle, which only the cyclic garbage collector frees (with the block's GPU memory,
        # at some later moment). A bound method of the block is kept as its function and a weak
        # reference to the block instead.
        if getattr(forward, "__self__", None) is block:
            self._func, self._block = forward.__func__, weakref.ref(block)
        else:
            self._func, self._block = forward, None
        self.offloader = offloader
        if hasattr(forward, "recomputed_in_backward"):  # a swapped block's forward (opendit_lite.memory)
            forward.recomputed_in_backward = True       # is recomputed in backward: it saves no weights

    @property
    def forward(self) -> Callable:
        """The block's own forward, as it was before checkpointing."""
        return self._func if self._block is None else self._func.__get__(self._block())

    def __deepcopy__(self, memo) -> "_CheckpointedForward":
        # A copy of the model (an EMA replica) checkpoints its own block: the weak reference would
        # still point at the original one.
        new = copy.copy(self)
        if self._block is not None:
            new._block = weakref.ref(copy.deepcopy(self._block(), memo))
        else:
            new._func = copy.deepcopy(self._func, memo)
        new.offloader = copy.deepcopy(self.offloader, memo)
        return new

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():  # sampling, EMA evaluation: nothing to save or recompute
            return self.forward(*args, **kwargs)
        leaves, spec = tree_flatten((args, kwargs))

        def run(*flat_args):
            call_args, call_kwargs = tree_unflatten(list(flat_args), spec)
            return self.forward(*call_args, **call_kwargs)

        saving = self.offloader.saving_inputs() if self.offloader is not None else contextlib.nullcontext()
        with set_checkpoint_early_stop(False), saving:
            return checkpoint(run, *leaves, use_reentrant=False)


def apply_activation_checkpointing(model: nn.Module, selective_ratio: float,
                                   offload: bool = False) -> CheckpointReport:
    """Checkpoint the model's blocks, leaving a fraction ``selective_ratio`` of them out.

    ``selective_ratio``: fraction of blocks NOT checkpointed, spread evenly over depth (0: every
    block checkpointed, 1: none; see ``select_blocks`` for the exact indices). Checkpointing a
    block trades its activation memory for a second forward of it in backward; leaving some out
    buys back speed when memory allows.

    ``offload``: also keep the checkpointed blocks' inputs in pinned CPU memory until backward
    (see ``opendit_lite.activation_checkpointing.offload``); a pass-through for tensors that are not on a GPU.

    Apply it once, to the unwrapped model, before DDP/ZeRO wrapping. Returns a ``CheckpointReport``.
    """
    blocks = find_checkpoint_blocks(model)
    chosen = select_blocks(len(blocks), selective_ratio)
    if offload and not chosen:
        raise ValueError(f"activation offload moves the inputs of checkpointed blocks, but selective_ratio="
                         f"{selective_ratio} checkpoints none of the {len(blocks)} blocks. Lower selective_ratio "
                         "(0 checkpoints every block) or turn offload off.")
    names = {id(module): name for name, module in model.named_modules()}
    done = [names[id(b)] for b in blocks if isinstance(vars(b).get("forward"), _CheckpointedForward)]
    if done:
        raise RuntimeError(f"activation checkpointing is already applied to {type(model).__name__} "
                           f"(blocks {', '.join(done)}); apply it once per model.")

    disabled_builtin = builtin_checkpointing_on(model)
    if disabled_builtin:
        model.disable_gradient_checkpointing()
    offloader = ActivationOffloader() if offload else None
    for i in chosen:
        blocks[i].forward = _CheckpointedForward(blocks[i], blocks[i].forward, offloader)

    return CheckpointReport(source=blocks_source(model), blocks=tuple(names[id(b)] for b in blocks),
                            checkpointed=tuple(chosen), offload=offload, disabled_builtin=disabled_builtin)
