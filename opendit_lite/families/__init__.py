"""The diffusers families trained today (Wan, Flux, SD3, CogVideoX, HunyuanVideo, LTX-Video), as the
trainers and samplers see them: one adapter per diffusers class, declared in a registry keyed by
the class name like the models' capabilities, giving the family's training recipe (objective,
timestep sampling, shift) and its forward inputs from a clip batch; ``FamilyDenoiser`` wraps a
model with its adapter into the ``(x, t, y, mask)`` denoiser every objective and sampler calls.

Nothing here imports diffusers: an adapter reads the model's config (a mapping) and calls the model.
"""

from . import adapters as _adapters  # noqa: F401  (registers the six families)
from .denoiser import FamilyDenoiser
from .registry import FAMILY_ADAPTERS, FamilyAdapter, Recipe, family_adapter, is_family, register_family

__all__ = ["FAMILY_ADAPTERS", "FamilyAdapter", "FamilyDenoiser", "Recipe", "family_adapter", "is_family",
           "register_family"]
