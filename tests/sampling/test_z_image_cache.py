"""Every step-cache kind on Z-Image (a tiny model with one noise and one context refiner before its two main
layers, one process, through this library's sampler as tests/sampling/test_family_caches.py samples the
six families). The block-level caches hook the main layers alone (the refiners run the image tokens and
the caption apart, at every step), the layers' tokens read as ``x``: first_block and magcache give the
samples of diffusers' own ``apply_first_block_cache`` / ``apply_mag_cache`` on the same transformer (which
hook the same layers; diffusers' registry entry for the block, which reads ``hidden_states``, corrected as
the cache corrects it), pab the samples of ``apply_pyramid_attention_broadcast``; teacache's signal is what
the first main layer's attention receives, and it skips as configured."""

import contextlib
import functools
from unittest import mock

import pytest
import torch
from diffusers.hooks import apply_first_block_cache, apply_mag_cache, apply_pyramid_attention_broadcast

from tests.sampling import fast_models
from tests.sampling.test_family_caches import KINDS, inference_context

Z_IMAGE = {"z_image": ("ZImageTransformer2DModel", dict(in_channels=3, n_refiner_layers=1), 1)}
SETTINGS = {"first_block": ["sample.cache.threshold=1.0"],  # the tiny first layer changes by more than 0.3 a step
            "magcache": KINDS["magcache"][0], "pab": KINDS["pab"][0]}


def sample(overrides=(), hook=None):
    with mock.patch.dict(fast_models.FAMILIES, Z_IMAGE):
        return fast_models.sample("z_image", overrides, hook=hook)


@functools.lru_cache(maxsize=None)
def plain() -> torch.Tensor:
    return sample()[0]


def diffusers_hooked(kind):
    """diffusers' own function of ``kind`` on the transformer; PAB's current timestep on the pipeline's 0-1000
    scale (Z-Image's transformer takes 1 - t / 1000)."""
    from diffusers.hooks.first_block_cache import FirstBlockCacheConfig

    def hook(model):
        seen = {}
        model.register_forward_pre_hook(
            lambda m, args, kwargs: seen.update(t=1000.0 * (1 - float(kwargs["t"].reshape(-1)[0]))), with_kwargs=True)
        apply, config = KINDS[kind][1](lambda: seen["t"])
        if kind == "first_block":
            config = FirstBlockCacheConfig(threshold=1.0)
        assert apply in (apply_first_block_cache, apply_mag_cache, apply_pyramid_attention_broadcast)
        apply(model, config)
        return inference_context(model)
    return hook


@pytest.mark.parametrize("kind", list(SETTINGS))
def test_each_kind_is_diffusers_own_hook_on_z_image_s_main_layers(kind):
    got, records = sample([f"sample.cache.kind={kind}", *SETTINGS[kind]])
    field = 1 if kind == "pab" else 0
    assert records[0][field] > 0 and any(r[field] < records[0][field] for r in records), records
    if kind != "pab":
        assert records[0][0] == 2  # the two main layers: the refiners are not in the cache's stack
    want, _ = sample(hook=diffusers_hooked(kind))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not torch.equal(got, plain()), "the cache changed nothing"


def test_teacache_reads_the_first_main_layer_s_attention_input_and_skips_as_configured():
    from opendit_lite.families import family_of

    seen = {}

    def first_call(name, value):
        seen.setdefault(name, value)

    def record(model):
        block = model.layers[0]
        block.register_forward_pre_hook(lambda m, a, k: first_call("call", (m, a, k)), with_kwargs=True)
        block.attention.register_forward_pre_hook(
            lambda m, a, k: first_call("attention", k.get("hidden_states", a[0] if a else None)), with_kwargs=True)
        return contextlib.nullcontext()

    _, records = sample(["sample.cache.kind=teacache", "sample.cache.threshold=1.0", "sample.cache.max_skip_steps=2"],
                        hook=record)
    full = records[0][0]
    assert [blocks for blocks, _ in records] == [full, 0, 0, full, 0, full]
    block, args, kwargs = seen["call"]
    signal = family_of("ZImageTransformer2DModel").step_cache.teacache_signal
    torch.testing.assert_close(signal(block, args, kwargs), seen["attention"], rtol=0, atol=1e-5)
