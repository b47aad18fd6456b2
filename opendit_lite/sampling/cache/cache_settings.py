"""``sample.cache`` resolved: each kind's settings with its defaults filled in, and a ConfigError for a
setting given to a kind that does not read it (it would silently do nothing)."""

import dataclasses
from typing import Any, Dict

from ...config.schema import CacheConfig
from ...errors import ConfigError

# kind -> its settings and their defaults (null in the config: this value). Chosen on the trained demos'
# 30-step samples to stay near 30 dB PSNR against uncached samples (benchmarks/sampling_speed.py,
# docs/sampling.md): PAB's published pyramid (cross-attention reused for 6 steps, temporal for 4)
# cost the video demo 6 dB, so every kind is recomputed every other step; TeaCache and MagCache reuse
# the cache for one step at a time (MagCache's published K is 3 for 50-step samplers), MagCache
# otherwise with diffusers' MagCacheConfig defaults. mag_ratios null: calibrated.
DEFAULTS: Dict[str, Dict[str, Any]] = {
    "none": {},
    "pab": {"spatial_skip": 2, "temporal_skip": 2, "cross_skip": 2, "timesteps": [100.0, 800.0]},
    "first_block": {"threshold": 0.1},
    "teacache": {"threshold": 0.1, "max_skip_steps": 1},
    "magcache": {"threshold": 0.06, "max_skip_steps": 1, "retention_ratio": 0.2, "mag_ratios": None},
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
