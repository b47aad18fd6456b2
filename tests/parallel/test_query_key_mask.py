"""A joint attention whose processor masks queries as well as keys (HunyuanVideo 1.5's ``valid[i] &
valid[j]``, declared ``query_mask`` in its spec) runs sequence-parallel with its key mask; any other
query-dependent mask, or one from a spec that does not declare it, is refused by name. The reduction is
checked here against masks written in the test; the 2- and 4-rank equality with the serial model is in
test_diffusers_families.py."""

from types import SimpleNamespace

import pytest
import torch

from opendit_lite.errors import SequenceParallelError
from opendit_lite.parallel.diffusers_sp.intercept import InterceptedAttention


def _attention(text: str, declared: bool = True):
    module = SimpleNamespace(sequence_parallel_query_mask=declared, sequence_parallel_text=text,
                             sequence_parallel_role="joint", sequence_parallel_name="transformer_blocks.0.attn")
    module._refuse = lambda what: InterceptedAttention._refuse(module, what)
    return module


def _outer(valid: torch.Tensor) -> torch.Tensor:
    """valid [B, L] -> the processor's mask [B, 1, L, L]: valid[i] & valid[j]."""
    return (valid[:, None, :, None] & valid[:, None, None, :]).bool()


@pytest.mark.parametrize("text", ["last", "first"])
def test_a_query_and_key_mask_runs_as_its_key_mask(text):
    image, words = torch.ones(2, 5, dtype=torch.bool), torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    valid = torch.cat([image, words] if text == "last" else [words, image], dim=1)   # [B, 8]
    keys = InterceptedAttention._key_mask(_attention(text), _outer(valid), text=3)
    assert torch.equal(keys, valid[:, None, None, :])


def test_other_query_dependent_masks_are_refused():
    valid = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    with pytest.raises(SequenceParallelError, match="only key masks are sharded"):
        InterceptedAttention._key_mask(_attention("last", declared=False), _outer(valid), text=2)
    with pytest.raises(SequenceParallelError, match="only key masks are sharded"):  # float masks: not a bool pattern
        InterceptedAttention._key_mask(_attention("last"), _outer(valid).float(), text=2)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    with pytest.raises(SequenceParallelError, match="not valid\\[query\\] & valid\\[key\\]"):
        InterceptedAttention._key_mask(_attention("last"), causal, text=2)
    masked_image = torch.tensor([[0, 1, 1, 1, 1]], dtype=torch.bool)  # an image query masked: its row would change
    with pytest.raises(SequenceParallelError, match="with valid image queries"):
        InterceptedAttention._key_mask(_attention("last"), _outer(masked_image), text=2)
