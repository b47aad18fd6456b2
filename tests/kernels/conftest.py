"""Every test in tests/kernels carries the ``kernels`` marker: `pytest -m kernels` selects the Triton
kernel tests (on a GPU they run on the real compiler; here under TRITON_INTERPRET=1)."""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.path).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.kernels)
