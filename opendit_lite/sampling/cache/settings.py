"""``sample.cache`` resolved: each kind's settings with its defaults filled in, and a ConfigError for a
setting given to a kind that does not read it (it would silently do nothing)."""

import dataclasses
from typing import Any, Dict

from ...config.schema import CacheConfig
from ...errors import ConfigError

# kind -> its settings and their defaults (null in the config: this value).
DEFAULTS: Dict[str, Dict[str, Any]] = {
    "none": {},
    # Pyramid Attention Broadcast's ranges (spatial < temporal < cross: the deeper the reuse, the more
    # alike an attention's outputs are between steps) and diffusers' timestep window.
    "pab": {"spatial_skip": 2, "temporal_skip": 4, "cross_skip": 6, "timesteps": [100.0, 800.0]},
    "first_block": {"threshold": 0.1},
    "teacache": {"threshold": 0.15, "max_skip_steps": 3},
    # MagCache's published defaults (diffusers' MagCacheConfig); mag_ratios null: calibrated.
    "magcache": {"threshold": 0.06, "max_skip_steps": 3, "retention_ratio": 0.2, "mag_ratios": None},
}


def resolve_cache(cache: CacheConfig) -> Dict[str, Any]:
    """``{"kind": ..., <setting>: value}`` for ``sample.cache``: the kind's settings, null ones at their
    defaults. A setting of another kind, or a malformed timestep window, is a ConfigError."""
    given = {f.name: getattr(cache, f.name) for f in dataclasses.fields(cache) if f.name != "kind"}
    own = DEFAULTS[cache.kind]
    stray = sorted(name for name, value in given.items() if value is not None and name not in own)
    if stray:
        readers = {name: [k for k, d in DEFAULTS.items() if name in d] for name in stray}
        listed = "; ".join(f"sample.cache.{name} is read by kind {' / '.join(kinds)}"
                           for name, kinds in readers.items())
        raise ConfigError(f"sample.cache.kind={cache.kind} reads {', '.join(own) or 'no settings'}, but {listed}. "
                          f"Remove {' and '.join('sample.cache.' + s for s in stray)} or choose that kind.")
    settings = {name: given[name] if given[name] is not None else default for name, default in own.items()}
    window = settings.get("timesteps")
    if window is not None and (len(window) != 2 or not window[0] < window[1]):
        raise ConfigError(f"sample.cache.timesteps must be [low, high] with low < high on the 0-1000 timestep scale "
                          f"(1000: pure noise), e.g. [100, 800]; got {window}.")
    return {"kind": cache.kind, **settings}
