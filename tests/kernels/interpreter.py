"""Run the Triton kernels in Triton's interpreter, on CPU tensors, when there is no GPU.

The variable must be set before ``opendit_lite.kernels`` is first imported (that is when the kernels
are decorated), so the conftests of the test folders that run kernels import this module at
collection time, before their test modules import anything. ``test_triton_path_is_taken`` fails
loudly if something imported the kernels earlier in the session.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
