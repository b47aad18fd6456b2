"""A rank whose collective write fails because another rank already removed the shared temporary
folder (that rank hit a full disk) reports the save as abandoned, not as a storage fault of its own."""

import os

import pytest
import torch

from opendit_lite.checkpoint import files
from opendit_lite.errors import CheckpointError


@pytest.fixture
def two_ranks(monkeypatch):
    monkeypatch.setattr(files, "global_world_size", lambda: 2)


def test_write_into_a_folder_another_rank_removed_is_abandoned(tmp_path, two_ranks):
    final = str(tmp_path / "step3")
    with pytest.raises(CheckpointError, match="abandoned") as info:
        with files.atomic_path(final) as tmp:
            os.makedirs(os.path.join(tmp, "rng"))
            files.remove_path(tmp)  # what the failing rank's clean-up does to the shared folder
            torch.save({"x": 1}, os.path.join(tmp, "rng", "rank00001.pt"))
    assert isinstance(info.value.__cause__, RuntimeError)
    assert os.listdir(tmp_path) == []


def test_other_failures_pass_through_unchanged(tmp_path, two_ranks):
    final = str(tmp_path / "step3")
    with pytest.raises(ValueError, match="not a storage fault"):
        with files.atomic_path(final) as tmp:
            os.makedirs(tmp)
            raise ValueError("not a storage fault")
    assert os.listdir(tmp_path) == []  # the partial folder went with the error


def test_one_process_keeps_the_original_error(tmp_path):
    final = str(tmp_path / "step3")
    with pytest.raises(RuntimeError, match="does not exist"):
        with files.atomic_path(final) as tmp:
            torch.save({"x": 1}, os.path.join(tmp, "rng", "rank00000.pt"))
