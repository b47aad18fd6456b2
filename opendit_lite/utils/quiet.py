"""Silence start-up noise of optional third-party features we do not use (Colossal-AI's optional
tensornvme/apex kernels, bitsandbytes' optional CPU kernels, torch.jit deprecation, torchao's Enum
registration notice from torch's pytree), so a script's
first lines are its own. Call before importing colossalai; real warnings stay visible."""

import logging
import warnings


def quiet_third_party_startup() -> None:
    for pattern in (r"Please install the latest tensornvme", r"Please install apex from source",
                    r"`torch\.jit\.script` is deprecated"):
        warnings.filterwarnings("ignore", message=pattern)
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").addFilter(
        lambda record: "is an Enum subclass and is now natively supported" not in record.getMessage())
