"""The optional ``torch.compile`` of the denoiser (``sample.compile``)."""

import sys

import torch.nn as nn


def compile_denoiser(model: nn.Module) -> nn.Module:
    """``torch.compile`` the model's ``forward`` in place (and return the model).

    The forward itself is replaced, not the module's ``__call__``, because guidance helpers such as
    DiT's ``forward_with_cfg`` call ``self.forward`` directly. Compiling falls back to eager with a
    warning where torch.compile is unavailable or fails on the first call."""
    from ..litegen import CompiledFunction

    print("sample.compile: compiling the denoiser's forward (the first step takes longer)", file=sys.stderr)
    model.forward = CompiledFunction(model.forward)
    return model
