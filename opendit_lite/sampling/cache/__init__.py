"""Step caching while sampling (``sample.cache``): work of one denoising step reused at the next ones,
through diffusers' cache hooks (``diffusers.hooks``) wherever they apply.

* ``pab``: each attention's output is reused for ``<kind>_skip`` steps inside the ``timesteps``
  window, decided from the step count and timestep: diffusers' ``PyramidAttentionBroadcastHook``;
* ``first_block``: the residual of every block after the first is reused while the first block's
  residual barely changes: diffusers' First-Block-Cache hooks, the decision agreed over the ranks;
* ``teacache``: the residual of the whole block stack is reused while the accumulated change of the
  first block's modulated input stays small: TeaCache's rule (not in diffusers 0.42) on diffusers'
  MagCache block hooks;
* ``magcache``: the same reuse while the accumulated error of the calibrated residual magnitude
  ratios stays small: diffusers' MagCache hooks.

The hooks find the blocks and their outputs through diffusers' ``TransformerBlockRegistry``: the
families' blocks are there; the zoo's blocks declare ``cache_streams`` and are registered from it
(``model_parts.py``). Attention kinds for PAB come from diffusers for a family, and from the zoo's
declared ``attention_kind``; TeaCache's signal from a zoo block's ``modulated_input`` or a family's
step-cache piece (``families/<family>/step_cache.py``). Under sequence parallelism and CFG-parallel
ranks, a decision that depends on the tensors is taken from sums all-reduced over the ranks that
share the batch (``cache_hooks.agreed_change``), so every rank skips the same steps; PAB and
MagCache decide from the step alone.

* ``cache_settings.py``: ``resolve_cache`` (the kinds' defaults, settings of other kinds refused);
* ``apply.py``: ``apply_step_cache`` and ``StepCache``, the handle the sampler drives;
* ``cache_hooks.py``, ``calibrate.py``, ``model_parts.py``: the hooks, MagCache's calibration, what
  the hooks read of a model's blocks and attention.
"""

from .apply import StepCache, StepRecord, apply_step_cache
from .cache_settings import DEFAULTS, resolve_cache

__all__ = ["DEFAULTS", "StepCache", "StepRecord", "apply_step_cache", "resolve_cache"]
