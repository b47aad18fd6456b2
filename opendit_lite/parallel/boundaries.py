"""Where a model without ``SequenceSplit``/``SequenceGather`` markers is sharded and gathered: at
its block list.

A diffusion transformer embeds its input (patches, plus positional embeddings, which are added
before the first block), runs a stack of blocks on the token sequence, and turns the tokens back
into an image in a final layer that mixes tokens (unpatchify). Everything between the first
block's input and the last block's output is token-wise except attention, so that span is what
sequence parallelism shards:

* a forward pre-hook on the first block replaces its token argument (the first positional
  argument, else the keyword ``hidden_states`` or ``x``), ``[B, N, D]``, by this rank's shard
  ``[B, ceil(N/P), D]`` (``SequenceParallelSplit``: pads to a multiple of P, checks once that
  the SP ranks hold the same tokens);
* a forward hook on the last block all-gathers its output (a tensor, or the first item of a
  tuple) back to ``[B, N, D]`` (``SequenceParallelGather``, padding dropped).

Other block arguments (timestep/class conditioning ``[B, D]``, text context ``[B, M, Dc]``) are
per sample or replicated and pass unchanged. The blocks come from ``opendit_lite.models.blocks.find_blocks``: the
model's ``get_fsdp_wrap_module_list()`` when it declares one, else its repeated
``ModuleList``/``Sequential`` of one class. Blocks must run in list order, once each per forward.

The split and gather modules are registered on the model as ``sequence_parallel_split`` and
``sequence_parallel_gather`` (no parameters, no state-dict entries) so that ``copy.deepcopy`` (an EMA
model) carries them and their hooks to the copy with a state of its own.
"""

from typing import List

import torch
import torch.nn as nn

from .sequence import SequenceParallelGather, SequenceParallelSplit, SequenceParallelState

_TOKEN_KEYWORDS = ("hidden_states", "x")


class ShardBlockInput:
    """Forward pre-hook (``with_kwargs=True``): the first block's tokens -> this rank's shard."""

    def __init__(self, split: SequenceParallelSplit):
        self.split = split

    def __call__(self, block: nn.Module, args: tuple, kwargs: dict):
        if args and isinstance(args[0], torch.Tensor):
            return (self.split(args[0]),) + tuple(args[1:]), kwargs            # [B, N/P, D]
        for name in _TOKEN_KEYWORDS:
            if isinstance(kwargs.get(name), torch.Tensor):
                return args, {**kwargs, name: self.split(kwargs[name])}
        raise TypeError(
            f"sequence parallelism shards the token sequence at the input of {type(block).__qualname__}, the "
            f"model's first block, but its call has no tensor as first positional argument nor as keyword "
            f"{' / '.join(_TOKEN_KEYWORDS)}"
        )


class GatherBlockOutput:
    """Forward hook: the last block's output shard -> the whole sequence on every rank."""

    def __init__(self, gather: SequenceParallelGather):
        self.gather = gather

    def __call__(self, block: nn.Module, args: tuple, output):
        if isinstance(output, torch.Tensor):
            return self.gather(output)                                          # [B, N, D]
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            return (self.gather(output[0]),) + tuple(output[1:])
        raise TypeError(f"sequence parallelism gathers the output of {type(block).__qualname__}, the model's "
                        f"last block, which must be a tensor or a tuple starting with one; got {type(output)}")


def place_sequence_boundaries(model: nn.Module, blocks: List[nn.Module], state: SequenceParallelState) -> None:
    """Shard at ``blocks[0]``'s input and gather at ``blocks[-1]``'s output (in place)."""
    if not blocks:
        raise ValueError(f"{type(model).__qualname__} has no blocks to place the sequence split and gather at")
    split, gather = SequenceParallelSplit(state, dim=1), SequenceParallelGather(state, dim=1)
    model.sequence_parallel_split = split
    model.sequence_parallel_gather = gather
    blocks[0].register_forward_pre_hook(ShardBlockInput(split), with_kwargs=True)
    blocks[-1].register_forward_hook(GatherBlockOutput(gather))
