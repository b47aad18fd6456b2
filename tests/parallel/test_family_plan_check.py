"""The end-of-forward check of a diffusers family's sequence-parallel plan: a forward that split and
gathered but ran no attention through the sequence-parallel ops fails loudly, unless a sampling step
cache reused attention or blocks in that forward (``FamilyState.note_reuse``); the next forward
expects attention again."""

import pytest
import torch

from opendit_lite.errors import SequenceParallelError
from opendit_lite.parallel.diffusers_sp.hooks import EndForward, FamilyState


def test_a_forward_without_attention_passes_only_when_a_cache_reused_work():
    state, model, out = FamilyState(None), torch.nn.Identity(), torch.zeros(1)
    check = EndForward(state, expect_attention=True)
    state.splits = state.gathers = 1
    with pytest.raises(SequenceParallelError, match="attention calls through the sequence-parallel ops=0"):
        check(model, (), out)
    state.note_reuse()
    assert check(model, (), out) is out
    state.begin()  # the next forward
    state.splits = state.gathers = 1
    with pytest.raises(SequenceParallelError):
        check(model, (), out)
    state.note_reuse()
    state.splits = 0  # a reused forward still splits and gathers
    with pytest.raises(SequenceParallelError, match="splits=0"):
        check(model, (), out)
