"""Step caches on the families whose blocks diffusers' ``TransformerBlockRegistry`` misses or misreads, which
declare their blocks' streams (``block_streams``), sampled in one process through this library's sampler as
tests/sampling/test_family_caches.py samples the six families:

* Z-Image (a tiny model with one noise and one context refiner before its two main layers): the block-level
  caches hook the main layers alone (``cache_block_lists``; the refiners run the image tokens and the caption
  apart, at every step), their tokens read as ``x``. first_block and magcache give the samples of diffusers'
  own ``apply_first_block_cache`` / ``apply_mag_cache`` on the same transformer (which hook the same layers,
  with the block's registry entry corrected as the cache corrects it), pab those of
  ``apply_pyramid_attention_broadcast``; teacache's signal is what the first main layer's attention receives,
  and it skips as configured.
* HunyuanVideo 1.5 (its double-stream block, which diffusers 0.42 does not register): first_block and
  magcache equal diffusers' own functions on the block registered as the cache registers it; teacache
  skips as configured (its signal is ``ada_norm_zero_signal``, checked on Flux, SD3 and HunyuanVideo).
"""

import contextlib
import functools
from unittest import mock

import pytest
import torch
from diffusers.hooks import apply_first_block_cache, apply_mag_cache, apply_pyramid_attention_broadcast
from diffusers.hooks.first_block_cache import FirstBlockCacheConfig

from tests.sampling import fast_models
from tests.sampling.test_family_caches import KINDS, inference_context

# case -> fast_models' family entry (diffusers class, config changes for 3-channel pixel clips, frames)
CASES = {"z_image": ("ZImageTransformer2DModel", dict(in_channels=3, n_refiner_layers=1), 1),
         "hunyuan_video15": ("HunyuanVideo15Transformer3DModel",
                             dict(in_channels=7, out_channels=3, text_embed_dim=32), 2)}  # 3 + 3 condition + mask
SETTINGS = {"first_block": ["sample.cache.threshold=1.0"],  # the tiny first block changes by more than 0.3 a step
            "magcache": KINDS["magcache"][0], "pab": KINDS["pab"][0]}


def sample(case: str, overrides=(), hook=None):
    with mock.patch.dict(fast_models.FAMILIES, {case: CASES[case]}):
        return fast_models.sample(case, overrides, hook=hook)


@functools.lru_cache(maxsize=None)
def plain(case: str) -> torch.Tensor:
    return sample(case)[0]


def diffusers_hooked(kind: str):
    """diffusers' own function of ``kind`` on the transformer; PAB's current timestep on the pipeline's 0-1000
    scale (Z-Image's transformer takes 1 - t / 1000; only Z-Image is checked with PAB)."""
    def hook(model):
        seen = {}
        if kind == "pab":
            model.register_forward_pre_hook(
                lambda m, args, kwargs: seen.update(t=1000.0 * (1 - float(kwargs["t"].reshape(-1)[0]))),
                with_kwargs=True)
        apply, config = KINDS[kind][1](lambda: seen["t"])
        if kind == "first_block":
            config = FirstBlockCacheConfig(threshold=1.0)
        assert apply in (apply_first_block_cache, apply_mag_cache, apply_pyramid_attention_broadcast)
        apply(model, config)
        return inference_context(model)
    return hook


@pytest.mark.parametrize("case, kind", [("z_image", "first_block"), ("z_image", "magcache"), ("z_image", "pab"),
                                        ("hunyuan_video15", "first_block"), ("hunyuan_video15", "magcache")])
def test_each_kind_is_diffusers_own_hook_on_the_declared_blocks(case, kind):
    got, records = sample(case, [f"sample.cache.kind={kind}", *SETTINGS[kind]])
    field = 1 if kind == "pab" else 0
    assert records[0][field] > 0 and any(r[field] < records[0][field] for r in records), records
    if kind != "pab":
        assert records[0][0] == 2  # the two main blocks (Z-Image: the refiners are not in the cache's stack)
    want, _ = sample(case, hook=diffusers_hooked(kind))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not torch.equal(got, plain(case)), "the cache changed nothing"


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

    teacache = ["sample.cache.kind=teacache", "sample.cache.threshold=1.0", "sample.cache.max_skip_steps=2"]
    _, records = sample("z_image", teacache, hook=record)
    full = records[0][0]
    assert [blocks for blocks, _ in records] == [full, 0, 0, full, 0, full]
    block, args, kwargs = seen["call"]
    signal = family_of("ZImageTransformer2DModel").step_cache.teacache_signal
    torch.testing.assert_close(signal(block, args, kwargs), seen["attention"], rtol=0, atol=1e-5)
    _, records = sample("hunyuan_video15", teacache)
    assert [blocks for blocks, _ in records] == [2, 0, 0, 2, 0, 2]
