"""Classifier-free guidance for the samplers: ``cfg_model_fn`` wraps a model into its guided version
following the batch layout the model declares (``guidance_layout``, read by
``opendit_lite.models.capabilities``); the arithmetic of each layout is in
``opendit_lite.models.cfg_layouts``, which the models' ``forward_with_cfg`` use too.
"""

import functools
from typing import Callable, Optional

import torch

from ..models.capabilities import guidance_layout
from ..models.cfg_layouts import concat_guided, guide, paired_guided

__all__ = ["cfg_model_fn", "guide"]


def cfg_model_fn(model: Callable[..., torch.Tensor], cfg_scale: float, channels: Optional[int] = None,
                 runner: Optional[Callable[..., torch.Tensor]] = None):
    """Wrap ``model(x, t, **model_kwargs)`` into its classifier-free-guided version for a sampler,
    following the model's ``guidance_layout``: "concat" (also a plain function, which declares
    nothing: DiT's convention) takes and returns a doubled batch [2B]; "paired" takes B samples
    with their captions and adds the null caption inside (``opendit_lite.models.cfg_layouts``).

    ``channels`` is how many leading output channels are guided; ``None`` guides as many as ``x``
    has: the noise / velocity prediction, leaving a learned-variance block untouched. DiT's
    reference guides exactly 3 channels even for 4-channel latents; pass ``channels=3`` to
    reproduce its samples.

    ``runner`` is what runs the model's doubled batch in its place (default: the model itself), e.g.
    CFG-parallel sampling's split of the batch over two groups of ranks; the layout is ``model``'s.
    """
    layout = guidance_layout(model) or "concat"
    guided = concat_guided if layout == "concat" else paired_guided
    return functools.partial(guided, model if runner is None else runner, cfg_scale=cfg_scale, channels=channels)
