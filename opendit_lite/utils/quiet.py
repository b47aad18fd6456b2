"""Silence start-up noise of optional third-party features we do not use (Colossal-AI's optional
tensornvme/apex kernels, bitsandbytes' optional CPU kernels, torch.jit and pytree deprecations), so a script's
first lines are its own. Call before importing colossalai; real warnings stay visible."""

import logging
import os
import sys
import warnings

from .exit_codes import DEBUG_ENV, DEBUG_FLAG


def quiet_third_party_startup() -> None:
    """Runs at ``import opendit_lite`` (and again at the top of each script); ``--debug`` on the
    command line or ``OPENDIT_DEBUG=1`` keeps every warning visible."""
    if DEBUG_FLAG in sys.argv or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        return
    for pattern in (r"Please install the latest tensornvme", r"Please install apex from source",
                    r"`torch\.jit\.script` is deprecated"):
        warnings.filterwarnings("ignore", message=pattern)
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # torchao (imported by Colossal-AI's dependencies) registers Enum constants that newer torch
    # versions support natively; torch logs a deprecation line for each at import.
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
