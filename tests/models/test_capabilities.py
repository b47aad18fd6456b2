"""Capabilities declared for classes of another library (declare_capabilities): read after the
class's own attribute and before the default, inherited by subclasses, with clear errors for an
unknown name, a capability declared twice and a malformed block list."""

import pytest
import torch.nn as nn

from opendit_lite.models import capabilities
from opendit_lite.models.blocks import find_blocks
from opendit_lite.models.capabilities import (
    DEFAULT_LORA_TARGETS,
    block_lists,
    declare_capabilities,
    is_video_model,
    lora_targets,
    supports_gradient_checkpointing,
)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x)


class Foreign(nn.Module):
    """Stands for another library's model: two lists of one block each (nothing to detect)."""

    def __init__(self):
        super().__init__()
        self.first = nn.ModuleList([Block()])
        self.second = nn.ModuleList([Block()])


class Subclass(Foreign):
    pass


class Own(Foreign):
    is_video = False  # the class's own attribute wins over a declaration


@pytest.fixture
def declared(monkeypatch):
    monkeypatch.setattr(capabilities, "_DECLARED", {})
    path = f"{Foreign.__module__}.{Foreign.__qualname__}"
    declare_capabilities(path, block_lists=("first", "second"), is_video=True)
    return path


def test_declared_capabilities_are_read_for_the_class_and_its_subclasses(declared):
    assert is_video_model(Foreign) and is_video_model(Subclass()) and not is_video_model(Own)
    assert block_lists(Subclass) == ("first", "second")
    model = Subclass()
    assert find_blocks(model) == [model.first[0], model.second[0]]
    assert lora_targets(Foreign) == DEFAULT_LORA_TARGETS and supports_gradient_checkpointing(Foreign)
    declare_capabilities(declared, lora_targets=("proj",))  # another capability of the same class adds up
    assert lora_targets(Subclass()) == ("proj",)


def test_declaration_errors(declared):
    with pytest.raises(ValueError, match=r"unknown capabilities \['is_vidoe'\]"):
        declare_capabilities(declared, is_vidoe=True)
    with pytest.raises(ValueError, match=r"\['is_video'\] already declared"):
        declare_capabilities(declared, is_video=False)
    declare_capabilities("some.Model", block_lists="blocks")
    model_cls = type("Model", (nn.Module,), {"__module__": "some"})
    with pytest.raises(ValueError, match="block_lists must be a non-empty tuple"):
        block_lists(model_cls)


def test_a_declared_block_list_that_is_not_a_module_list_is_an_error(declared):
    model = Foreign()
    model.second = Block()
    with pytest.raises(ValueError, match=r"Foreign.second is Block, not an nn.ModuleList"):
        find_blocks(model)
