"""No step cache hooks Z-Image's blocks (its forward runs the image tokens, the caption and the joint
sequence through one block class in turn): every ``sample.cache.kind`` is a ConfigError saying so,
before any hook is installed."""

import pytest

from opendit_lite.config.schema import CacheConfig
from opendit_lite.errors import ConfigError
from opendit_lite.sampling.cache.apply import apply_step_cache
from opendit_lite.sampling.cache.cache_settings import resolve_cache
from tests.parallel import tiny_families as fam


@pytest.mark.parametrize("kind", ["pab", "first_block", "teacache", "magcache"])
def test_every_step_cache_kind_refuses_z_image_and_says_why(kind):
    model = fam.build("z_image")
    with pytest.raises(ConfigError, match=rf"sample.cache.kind={kind} cannot hook ZImageTransformer2DModel: its "
                                          rf"blocks run the image tokens, the caption"):
        apply_step_cache(model, resolve_cache(CacheConfig(kind=kind)), num_steps=4, num_timesteps=1000)
    assert not any(getattr(m, "_diffusers_hook", None) for m in model.modules())
