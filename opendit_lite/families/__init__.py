"""The diffusers families trained today (Wan, HunyuanVideo, CogVideoX, LTX-Video, Flux, SD3, Z-Image): one
folder per family (``opendit_lite/families/<family>/``) holding everything specific to it, found
through one registry (``registry.py``). Importing this package registers the families and fans
their pieces out to the mechanisms that look them up (capabilities, sequence parallelism, fused
AdaLN); every entry point that builds, parallelizes, plans or samples a model imports it.

``FamilyDenoiser`` wraps a model with its family's adapter into the ``(x, t, y, mask)`` denoiser
every objective and sampler calls; ``PipelineDenoiser`` (``pipeline_denoiser.py``) wraps the
transformer of a run from a diffusers pipeline folder, fed what that pipeline feeds it (each
family's ``<family>/conditioning.py``). Adding a family: ``docs/adding_a_family.md``.

Training recipes (objective, training-time distribution, shift), as each family's release trains
and samples (each in its ``<family>/adapter.py``; a run from a pipeline folder takes the shift of the
pipeline's own scheduler instead):

| family | objective | times | shift |
|---|---|---|---|
| Wan 2.x | flow matching | uniform | 5 |
| HunyuanVideo | flow matching | uniform | 7 |
| HunyuanVideo 1.5 | flow matching | uniform | 5 (the 480p release's sampling shift) |
| LTX-Video | flow matching | logit-normal | by token count: e^0.95 at 1024 tokens .. e^2.05 at 4096 |
| SD3 / SD3.5 | flow matching | logit-normal | 3 |
| Flux | flow matching | logit-normal | by token count: e^0.5 at 256 tokens .. e^1.15 at 4096 |
| FLUX.2 | flow matching | logit-normal | FLUX.2's empirical mu at 50 steps: e^1.62 at 256 tokens, e^2.02 at 4096 |
| CogVideoX | v-prediction, DDPM schedule | uniform steps | SNR shift 1 (the 5B and 1.5 models) |
| Z-Image | flow matching | logit-normal (not published; as SD3 and Flux) | 3 (the release's scheduler) |

Nothing here imports diffusers at import time: an adapter reads the model's config (a mapping) and
calls the model; the other pieces name diffusers' classes.
"""

from . import (  # noqa: F401  (registers the families)
    cogvideox,
    flux,
    flux2,
    hunyuan_video,
    hunyuan_video15,
    ltx_video,
    qwen_image,
    sd3,
    wan,
    z_image,
)
from .adapter_base import FamilyAdapter, Recipe
from .conditioning_base import PipelineConditioning
from .family_denoiser import FamilyDenoiser
from .registry import (
    FAMILIES,
    Family,
    PipelineVariant,
    Release,
    conditioning_of_pipeline,
    family_adapter,
    family_class_names,
    family_of,
    family_of_pipeline,
    find_family,
    is_family,
    register_family,
    unregistered_pieces,
)
from .step_cache_spec import StepCacheSpec

__all__ = ["FAMILIES", "Family", "FamilyAdapter", "FamilyDenoiser", "PipelineConditioning", "PipelineVariant", "Recipe",
           "Release", "StepCacheSpec", "conditioning_of_pipeline", "family_adapter", "family_class_names", "family_of",
           "family_of_pipeline", "find_family", "is_family", "register_family", "unregistered_pieces"]
