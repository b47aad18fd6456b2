"""Every test in tests/kernels carries the ``kernels`` marker: `pytest -m kernels` selects the Triton
kernel tests (on a GPU they run on the real compiler; here under TRITON_INTERPRET=1)."""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.path).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.kernels)


@pytest.fixture(autouse=True)
def _always_the_kernel(monkeypatch):
    """The kernel tests test the Triton kernels: on a GPU the dispatch must not serve a shape with the
    compiled torch path because it measured faster (kernel_choice.py; tested in test_kernel_choice.py)."""
    monkeypatch.setenv("OPENDIT_KERNEL_CHOICE", "fused")
