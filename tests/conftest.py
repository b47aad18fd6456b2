import functools
import os
import sys

import pytest
import torch

# Without a GPU, the Triton kernels run in Triton's interpreter on CPU tensors. The variable must be
# set before opendit_lite.kernels is first imported (the kernels are decorated then), hence here;
# tests/kernels checks that the Triton path is really taken.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Two cores in CI: keep intra-op threads from oversubscribing when tests spawn ranks. Under
# pytest-xdist (make test: two workers) each worker, and every process it starts, gets one thread.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
else:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    """family -> the folder of its tiny random diffusers pipeline (``opendit_lite.families.tiny_pipelines``),
    built and saved once per test run, shared by the xdist workers. Tests read it, never write it."""
    from tests.families.pipeline_capture import tiny_pipeline_folder

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' base folders share a parent
        root = root.parent
    return functools.partial(tiny_pipeline_folder, str(root / "tiny_pipelines"))
