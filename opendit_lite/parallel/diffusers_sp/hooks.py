"""The forward hooks that run a family's split/gather plan on a diffusers model, with the package's
collectives (padding of uneven token counts, exact-adjoint gathers), and the per-forward state they
share with the attention ops.

* ``SplitInputs`` (pre-hook) / ``SplitOutputs`` (hook): shard forward arguments or outputs of a module,
  padding to a multiple of P, and record the token count N of this forward (every split of one forward
  must see the same N);
* ``GatherOutput`` (hook): all-gather a module's output and drop the padding;
* ``BeginForward`` (pre-hook on the model, first of all) resets the state; ``EndForward`` (hook on the
  model) fails loudly when a forward did not split, gather and run its attention through the ops (a
  forward in which a sampling step cache reused attention or blocks, ``note_reuse``, may run none).

Plain ``torch.nn.Module`` hooks, as ``boundaries.py`` uses for our models, rather than diffusers'
``HookRegistry`` (whose forward metadata helpers are internal). A ``copy.deepcopy`` of the model (an EMA
copy) carries the hooks with a state of its own that shares the process group.
"""

import inspect
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from opendit_lite.errors import SequenceParallelError

from ..comm import gather_sequence, split_sequence
from ..sequence import SequenceParallelState
from .spec_types import Gather, Split, SplitEntry


class FamilyState(SequenceParallelState):
    """``SequenceParallelState`` plus the counters of one forward (splits, gathers, attention calls)."""

    def __init__(self, group: Optional[dist.ProcessGroup]):
        super().__init__(group)
        self.begin()

    def begin(self) -> None:
        self.seq_len = None
        self.splits = self.gathers = self.intercepts = 0
        self.reused = False  # a sampling step cache reused attention or blocks in this forward (note_reuse)

    def note_reuse(self) -> None:
        """This forward reused attention or block outputs of an earlier step (a sampling step cache), so
        it may run no attention through the sequence-parallel ops; its splits and gathers still run."""
        self.reused = True

    def record(self, length: int, where: str) -> None:
        if self.seq_len is None:
            self.seq_len = length
        elif self.seq_len != length:
            raise SequenceParallelError(
                f"sequence-parallel plan: {where} has {length} tokens along its split dimension but an earlier "
                f"split of this forward had {self.seq_len}; this model version lays out its tokens differently "
                f"from the family's spec (opendit_lite/families/<family>/sp_spec.py)")


def forward_parameters(module: nn.Module) -> List[str]:
    """The names of ``module.forward``'s parameters, without self."""
    return list(inspect.signature(type(module).forward).parameters)[1:]


class _Splitter:
    def __init__(self, state: FamilyState, where: str):
        self.state, self.where = state, where or "<model>"

    def _split(self, x: torch.Tensor, spec: Split, what: str) -> torch.Tensor:
        if spec.ndim is not None and x.dim() != spec.ndim:
            if spec.optional:
                return x
            raise SequenceParallelError(
                f"sequence-parallel plan: {what} of '{self.where}' has {x.dim()} dimensions, the family's spec "
                f"expects {spec.ndim}; this diffusers version lays out its tokens differently")
        self.state.record(x.size(spec.dim), f"{what} of '{self.where}'")
        self.state.splits += 1
        return split_sequence(x, self.state.group, spec.dim)

    def apply(self, value, spec: SplitEntry, what: str):
        if value is None:
            return None
        if isinstance(spec, tuple):
            return type(value)(self._split(v, s, f"{what}[{i}]") for i, (v, s) in enumerate(zip(value, spec)))
        return self._split(value, spec, what)


class SplitInputs(_Splitter):
    """Forward pre-hook (``with_kwargs=True``): shard the named forward arguments."""

    def __init__(self, state: FamilyState, where: str, entries: Dict[str, SplitEntry], params: List[str]):
        super().__init__(state, where)
        self.entries, self.params = entries, params

    def __call__(self, module, args, kwargs):
        args = list(args)
        for name, spec in self.entries.items():
            if name in kwargs:
                kwargs[name] = self.apply(kwargs[name], spec, f"argument '{name}'")
            elif self.params.index(name) < len(args):
                index = self.params.index(name)
                args[index] = self.apply(args[index], spec, f"argument '{name}'")
        return tuple(args), kwargs


class SplitOutputs(_Splitter):
    """Forward hook: shard outputs of a module by index (0 for a plain tensor output)."""

    def __init__(self, state: FamilyState, where: str, entries: Dict[int, SplitEntry]):
        super().__init__(state, where)
        self.entries = entries

    def __call__(self, module, args, output):
        outputs = [output] if torch.is_tensor(output) else list(output)
        for index, spec in self.entries.items():
            outputs[index] = self.apply(outputs[index], spec, f"output {index}")
        return outputs[0] if torch.is_tensor(output) else type(output)(outputs)


class GatherOutput:
    """Forward hook: all-gather a module's output along the spec's dim and drop the padding."""

    def __init__(self, state: FamilyState, where: str, spec: Gather):
        self.state, self.where, self.spec = state, where, spec

    def __call__(self, module, args, output):
        if self.state.seq_len is None:
            raise SequenceParallelError(f"'{self.where}' would gather tokens that were never split: the family's "
                                        f"split points did not run before it")
        if self.spec.ndim is not None and output.dim() != self.spec.ndim:
            raise SequenceParallelError(f"sequence-parallel plan: the output of '{self.where}' has {output.dim()} "
                                        f"dimensions, the family's spec expects {self.spec.ndim}")
        self.state.gathers += 1
        return gather_sequence(output, self.state.group, self.spec.dim, self.state.seq_len)


class BeginForward:
    """Forward pre-hook on the model, before every other hook: one forward = one plan run."""

    def __init__(self, state: FamilyState):
        self.state = state

    def __call__(self, module, args):
        self.state.begin()


class EndForward:
    """Forward hook on the model: a forward that skipped its plan would have computed on shards."""

    def __init__(self, state: FamilyState, expect_attention: bool):
        self.state, self.expect_attention = state, expect_attention

    def __call__(self, module, args, output):
        s = self.state
        if not s.splits or not s.gathers or (self.expect_attention and not s.intercepts and not s.reused):
            raise SequenceParallelError(
                f"the sequence-parallel forward of {type(module).__name__} did not run its plan (splits={s.splits}, "
                f"gathers={s.gathers}, attention calls through the sequence-parallel ops={s.intercepts}): the "
                f"model's forward no longer passes through the modules of its family's spec")
        return output
