"""The hooks the step caches add to a denoiser, on diffusers' hook machinery (``diffusers.hooks``):

* ``CountingHook``: counts the computations of a block or an attention module (registered first, so
  it sits inside every cache hook and counts only what really runs);
* ``AgreedFirstBlockHook``: diffusers' First-Block-Cache head hook whose decision is taken over all
  the ranks that share the batch (see ``agreed_change``); ``FirstBlockTailHook``: its hook on the
  last block, which also takes a last block that reads the text stream without returning it;
* ``TeaCacheHeadHook`` and ``TeaCacheState``: TeaCache's rule (which diffusers does not ship) as a
  head-block hook over MagCache's state; diffusers' ``MagCacheBlockHook`` does the rest (the other
  blocks pass their input through on a skipped step, the last one stores the residual);
* ``ReuseNotice``: tells a sequence-parallel diffusers model that a forward reused work (so it may
  run no attention through the sequence-parallel ops).

Why agreement: under sequence parallelism each rank holds a shard of the tokens, and with CFG-parallel
ranks one branch of the batch, so a change measured on local tensors differs between ranks, and
ranks that decide differently would wait forever on each other's collectives inside the blocks.
``agreed_change`` all-reduces the two sums a relative change is made of, so every rank of the group
takes the decision one process would take on the whole batch.
"""

from typing import Callable, Optional

import torch
import torch.distributed as dist
from diffusers.hooks.first_block_cache import FBCBlockHook, FBCHeadBlockHook
from diffusers.hooks.hooks import ModelHook, StateManager
from diffusers.hooks.mag_cache import MagCacheState
from diffusers.utils.torch_utils import unwrap_module

from .model_parts import block_metadata


class Tally:
    """Running counts of what the hooked denoiser computed: ``blocks`` and ``attention`` forwards."""

    def __init__(self):
        self.blocks = 0
        self.attention = 0


class CountingHook(ModelHook):
    """Adds one to ``tally.<field>`` each time the hooked module's own forward runs."""

    def __init__(self, tally: Tally, field: str):
        super().__init__()
        self.tally, self.field = tally, field

    def pre_forward(self, module, *args, **kwargs):
        setattr(self.tally, self.field, getattr(self.tally, self.field) + 1)
        return args, kwargs


class ReuseNotice(ModelHook):
    """On the denoiser itself (outermost): after a forward in which fewer ``field`` forwards ran than
    ``full()`` (the cache reused some), tells the model's sequence-parallel state (``note_reuse``), whose
    end-of-forward check otherwise expects attention to run through the sequence-parallel ops."""

    def __init__(self, tally: Tally, field: str, full: Callable[[], int], state):
        super().__init__()
        self.tally, self.field, self.full, self.state = tally, field, full, state
        self.before = 0

    def pre_forward(self, module, *args, **kwargs):
        self.before = getattr(self.tally, self.field)
        return args, kwargs

    def post_forward(self, module, output):
        if getattr(self.tally, self.field) - self.before < self.full():
            self.state.note_reuse()
        return output


def agreed_change(change: torch.Tensor, reference: torch.Tensor, group: Optional[dist.ProcessGroup]) -> float:
    """``sum|change| / sum|reference|`` over every rank of ``group`` (None: this rank alone): the
    relative L1 change of a tensor whose shards (tokens, guidance branches) the ranks hold. The sums
    are taken in float64, so one process and any split of the batch agree to rounding."""
    sums = torch.stack([change.abs().sum(dtype=torch.float64), reference.abs().sum(dtype=torch.float64)])
    if group is not None:
        dist.all_reduce(sums, group=group)
    num, den = sums.tolist()
    return num / den if den > 0 else float("inf")


class AgreedFirstBlockHook(FBCHeadBlockHook):
    """diffusers' First-Block-Cache head hook (the rest of the blocks are skipped while the first
    block's residual differs from the one of the last computed step by less than ``threshold``,
    relatively), with the change measured over the ranks of ``group``."""

    def __init__(self, state_manager: StateManager, threshold: float, group: Optional[dist.ProcessGroup]):
        super().__init__(state_manager, threshold)
        self.group = group

    @torch.compiler.disable
    def _should_compute_remaining_blocks(self, hidden_states_residual: torch.Tensor) -> bool:
        previous = self.state_manager.get_state().head_block_residual
        if previous is None:
            return True
        return agreed_change(hidden_states_residual - previous, previous, self.group) > self.threshold


class FirstBlockTailHook(FBCBlockHook):
    """diffusers' First-Block-Cache hook on the last block (``is_tail``): on a computed step it stores
    the residuals of the blocks after the first, for the tokens and the text stream. A last block that
    returns None for the text stream (SD3's ``context_pre_only`` block only reads it) stores a zero
    text residual: on a skipped step the text then passes through unchanged, and nothing after the
    stack reads it. diffusers 0.42's own hook subtracts from the None. A single-stream last block after
    a two-stream head (FLUX.2's: one tensor, the text first) stores the residuals of its two parts;
    diffusers 0.42's own hook subtracts the head's pair from the one tensor."""

    def __init__(self, state_manager: StateManager):
        super().__init__(state_manager, is_tail=True)

    def new_forward(self, module: torch.nn.Module, *args, **kwargs):
        state, meta = self.state_manager.get_state(), self._metadata
        if state.should_compute and meta.return_encoder_hidden_states_index is None and isinstance(
                state.head_block_output, (list, tuple)):
            # a single-stream last block after a two-stream head: its output is [text; tokens] as one sequence
            output = self.fn_ref.original_forward(*args, **kwargs)                 # [B, M + N, D]
            head_hidden, head_text = state.head_block_output
            text = head_text.shape[1]
            state.tail_block_residuals = (output[:, text:] - head_hidden, output[:, :text] - head_text)
            return output
        if not state.should_compute or meta.return_encoder_hidden_states_index is None:
            return super().new_forward(module, *args, **kwargs)
        output = self.fn_ref.original_forward(*args, **kwargs)                     # (tokens, text), in its order
        hidden, text = output[meta.return_hidden_states_index], output[meta.return_encoder_hidden_states_index]
        head_hidden, head_text = state.head_block_output
        text_residual = torch.zeros((), dtype=head_text.dtype, device=head_text.device) if text is None \
            else text - head_text
        state.tail_block_residuals = (hidden - head_hidden, text_residual)
        return output


class TeaCacheState(MagCacheState):
    """MagCache's state (step index, residual of the last computed step, accumulated error and
    skipped steps) plus TeaCache's previous signal."""

    def __init__(self):
        super().__init__()
        self.previous_signal: Optional[torch.Tensor] = None

    def reset(self):
        super().reset()
        self.previous_signal = None


class TeaCacheHeadHook(ModelHook):
    """TeaCache (Liu et al., "Timestep Embedding Tells: It's Time to Cache for Video Diffusion
    Model", 2024) on the first block: its signal is the timestep-modulated input of the first block
    (``signal(block, args, kwargs)``); the relative L1 change of the signal from the previous step,
    taken over the ranks of ``group``, is accumulated, and while the sum stays below ``threshold``
    (and at most ``max_skip_steps`` steps in a row) the whole block stack is replaced by the
    residual it added at the last computed step. The first and the last steps are always computed.
    The model-specific polynomial that TeaCache fits to rescale the change is left out (the identity):
    the zoo's models have no published fit."""

    _is_stateful = True

    def __init__(self, state_manager: StateManager, threshold: float, max_skip_steps: int, num_steps: int,
                 signal: Callable, group: Optional[dist.ProcessGroup]):
        super().__init__()
        self.state_manager, self.threshold, self.max_skip_steps = state_manager, threshold, max_skip_steps
        self.num_steps, self.signal, self.group = num_steps, signal, group
        self._metadata = None

    def initialize_hook(self, module):
        self._metadata = block_metadata(type(unwrap_module(module)))
        return module

    @torch.compiler.disable
    def _should_compute(self, state: TeaCacheState, signal: torch.Tensor) -> bool:
        previous, state.previous_signal = state.previous_signal, signal
        last = state.step_index >= self.num_steps - 1
        if previous is None or state.previous_residual is None or last:
            state.accumulated_err, state.accumulated_steps = 0.0, 0
            return True
        state.accumulated_err += agreed_change(signal - previous, previous, self.group)
        if state.accumulated_err < self.threshold and state.accumulated_steps < self.max_skip_steps:
            state.accumulated_steps += 1
            return False
        state.accumulated_err, state.accumulated_steps = 0.0, 0
        return True

    def new_forward(self, module: torch.nn.Module, *args, **kwargs):
        state: TeaCacheState = self.state_manager.get_state()
        meta = self._metadata
        hidden = meta._get_parameter_from_args_kwargs(meta.hidden_states_argument_name, args, kwargs)
        state.head_block_input = hidden
        state.should_compute = self._should_compute(state, self.signal(unwrap_module(module), args, kwargs))
        if state.should_compute:
            return self.fn_ref.original_forward(*args, **kwargs)
        output = hidden + state.previous_residual                       # the whole stack's last residual
        if meta.return_encoder_hidden_states_index is None:
            return output
        outputs = [None] * (max(meta.return_hidden_states_index, meta.return_encoder_hidden_states_index) + 1)
        outputs[meta.return_hidden_states_index] = output
        outputs[meta.return_encoder_hidden_states_index] = meta._get_parameter_from_args_kwargs(
            "encoder_hidden_states", args, kwargs)                      # the text stream passes through
        return tuple(outputs)

    def reset_state(self, module):
        self.state_manager.reset()
        return module
