"""Which blocks are found (declared or detected) and which of them are checkpointed."""

import pytest
import torch.nn as nn

from opendit_lite.activation_checkpointing import find_checkpoint_blocks, select_blocks
from opendit_lite.models.dit import DiT
from tests.activation_checkpointing.toy_models import (
    DeclaredToyDiT,
    MLPBlock,
    NestedBlocksModel,
    SequentialModel,
    SingleBlockModel,
    SpatialTemporalModel,
    ToyBlock,
    ToyDiT,
    UserLayer,
    UserModel,
)


def block_names(model):
    names = {id(m): name for name, m in model.named_modules()}
    return [names[id(b)] for b in find_checkpoint_blocks(model)]


# ----------------------------------------------------------------------------------------------
# select_blocks: the checkpointed indices, written out for a 28-block model (DiT-XL's depth)
# ----------------------------------------------------------------------------------------------

ALL_28 = list(range(28))
CHECKPOINTED_28 = {
    0.0: ALL_28,
    # 7 left out, the middle of each quarter-of-four: 2, 6, 10, 14, 18, 22, 26
    0.25: [0, 1, 3, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16, 17, 19, 20, 21, 23, 24, 25, 27],
    # 14 left out: the odd indices
    0.5: [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26],
    1.0: [],
}


@pytest.mark.parametrize("ratio", sorted(CHECKPOINTED_28))
def test_select_blocks_28(ratio):
    assert select_blocks(28, ratio) == CHECKPOINTED_28[ratio]


def test_select_blocks_counts_and_spread():
    # Rounding down: at most the requested fraction is left out; decimal ratios count as written.
    assert len(select_blocks(28, 0.2)) == 28 - 5            # 5.6 -> 5 left out
    assert len(select_blocks(100, 0.29)) == 100 - 29        # 0.29 * 100 = 28.999... in binary
    assert select_blocks(0, 0.5) == []
    assert select_blocks(1, 0.5) == [0]                     # 0.5 of one block rounds down to none
    # Left-out blocks are evenly spaced: gaps differ by at most one.
    for n, ratio in [(28, 0.1), (40, 0.3), (7, 0.5), (56, 0.25)]:
        kept = sorted(set(range(n)) - set(select_blocks(n, ratio)))
        gaps = [b - a for a, b in zip(kept, kept[1:])]
        assert max(gaps) - min(gaps) <= 1, (n, ratio, kept)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.5", None, True])
def test_select_blocks_rejects_bad_ratio(bad):
    with pytest.raises(ValueError, match="selective_ratio"):
        select_blocks(28, bad)


def test_select_blocks_rejects_bad_count():
    with pytest.raises(ValueError, match="num_blocks"):
        select_blocks(-1, 0.5)


# ----------------------------------------------------------------------------------------------
# find_checkpoint_blocks
# ----------------------------------------------------------------------------------------------

def test_declared_blocks_are_used():
    model = DeclaredToyDiT(depth=3)
    assert find_checkpoint_blocks(model) == list(model.blocks)


def test_dit_declares_its_blocks():
    model = DiT(input_size=4, depth=3, hidden_size=32, num_heads=2, num_classes=4)
    assert find_checkpoint_blocks(model) == list(model.blocks)


@pytest.mark.parametrize("model, expected, block_class", [
    (ToyDiT(depth=4), [f"blocks.{i}" for i in range(4)], ToyBlock),
    (NestedBlocksModel(depth=3), [f"transformer.blocks.{i}" for i in range(3)], ToyBlock),
    # both lists, in module order; the nine frame embedders are more but smaller
    (SpatialTemporalModel(depth=4),
     [f"spatial_blocks.{i}" for i in range(4)] + [f"temporal_blocks.{i}" for i in range(4)], ToyBlock),
    (SequentialModel(depth=5), [f"body.{i}" for i in range(5)], MLPBlock),
    # not the same-class lists inside each layer, not the ten output heads
    (UserModel(depth=4), [f"layers.{i}" for i in range(4)], UserLayer),
], ids=["dit-like", "nested", "spatial-temporal", "sequential", "user-model"])
def test_detected_blocks(model, expected, block_class):
    assert block_names(model) == expected
    assert all(type(b) is block_class for b in find_checkpoint_blocks(model))


def test_detection_prefers_finer_blocks_on_a_tie():
    # Stages that only wrap a list of blocks hold the same parameters as the blocks: take the blocks.
    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([MLPBlock(8) for _ in range(3)])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    model = nn.Sequential(Stage(), Stage())
    assert block_names(model) == [f"{s}.blocks.{i}" for s in range(2) for i in range(3)]


def test_nothing_repeated_is_a_clear_error():
    with pytest.raises(ValueError, match="no repeated blocks.*get_fsdp_wrap_module_list"):
        find_checkpoint_blocks(SingleBlockModel())


class _Declares(ToyDiT):
    def __init__(self, blocks_fn):
        super().__init__(depth=2)
        self._blocks_fn = blocks_fn

    def get_fsdp_wrap_module_list(self):
        return self._blocks_fn(self)


@pytest.mark.parametrize("blocks_fn, error, message", [
    (lambda m: [], ValueError, "returned no modules"),
    (lambda m: [m.blocks], TypeError, "ModuleList, which is never called"),
    (lambda m: [[m.blocks[0]], [m.blocks[1]]], TypeError, "item 0 is a list"),
    (lambda m: [ToyBlock(16)], ValueError, "not a submodule"),
    (lambda m: [m.blocks[0], m.blocks[0]], ValueError, "listed twice"),
], ids=["empty", "module-list", "list-of-lists", "foreign", "duplicate"])
def test_declared_blocks_are_checked(blocks_fn, error, message):
    with pytest.raises(error, match=message):
        find_checkpoint_blocks(_Declares(blocks_fn))
