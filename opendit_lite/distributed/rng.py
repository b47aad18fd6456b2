"""Random-number-generator state of one process as plain tensors and numbers.

A resumed run continues the random streams exactly (noise, timesteps, dropout, data augmentation)
only if every generator it draws from is restored: Python's ``random``, NumPy's global generator,
torch's CPU generator and the current CUDA device's generator. The native ``getstate()`` values are
tuples and NumPy arrays; they are converted here into tensors, ints, floats and strings so that a
checkpoint holding them loads with ``torch.load(weights_only=True)``, which refuses any other
pickled object and so never runs code from a file.
"""

import random
from typing import Any, Dict

import numpy as np
import torch


def get_rng_state() -> Dict[str, Any]:
    """Snapshot every generator of this process; the result is ``weights_only``-loadable."""
    py_version, py_internal, py_gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "python_version": py_version,
        # 624 Mersenne-Twister words plus the position index, all < 2**32.
        "python_state": torch.tensor(py_internal, dtype=torch.int64),
        "python_gauss": py_gauss,
        "numpy_kind": np_kind,
        "numpy_keys": torch.from_numpy(np_keys.astype(np.int64)),
        "numpy_pos": int(np_pos),
        "numpy_has_gauss": int(np_has_gauss),
        "numpy_gauss": float(np_gauss),
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore a snapshot from :func:`get_rng_state`.

    The CUDA generator is restored only when both the snapshot and this process have CUDA: a state
    saved on a GPU machine still restores the CPU-side generators on a CPU-only one.
    """
    random.setstate(
        (state["python_version"], tuple(int(v) for v in state["python_state"].tolist()), state["python_gauss"])
    )
    np.random.set_state(
        (
            state["numpy_kind"],
            state["numpy_keys"].numpy().astype(np.uint32),
            state["numpy_pos"],
            state["numpy_has_gauss"],
            state["numpy_gauss"],
        )
    )
    torch.set_rng_state(state["torch_cpu"])
    if state["torch_cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch_cuda"])
