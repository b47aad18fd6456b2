"""Every step-cache kind on the six diffusers families (tiny models, one process), through diffusers'
own hooks: ``sample.cache`` pab, first_block and magcache give the samples of diffusers'
``apply_pyramid_attention_broadcast``, ``apply_first_block_cache`` and ``apply_mag_cache`` called on
the same transformer as its pipelines call them (the reference), and teacache, which diffusers 0.42
does not ship, reads each family's declared signal (``families/<family>/step_cache.py``), the tensor
its first block's attention receives, and skips as configured. The rank agreement of every kind is
in test_fast_sampling_ranks.py."""

import contextlib

import pytest
import torch
from diffusers.hooks import (
    FirstBlockCacheConfig,
    MagCacheConfig,
    PyramidAttentionBroadcastConfig,
    apply_first_block_cache,
    apply_mag_cache,
    apply_pyramid_attention_broadcast,
)
from diffusers.hooks.hooks import CacheContext, _set_cache_context

from opendit_lite.families import family_of
from tests.sampling.fast_models import FAMILIES, STEPS, sample

CASES = ["wan", *FAMILIES]  # wan, flux, sd3, cogvideox, hunyuan_video, ltx_video
RATIOS = [1.0, 1.02, 0.99, 1.01, 0.97, 0.9]
# kind -> (sample.cache settings, diffusers' function and config doing the same)
KINDS = {
    "pab": (["sample.cache.spatial_skip=2", "sample.cache.cross_skip=3", "sample.cache.timesteps=[100,900]"],
            lambda now: (apply_pyramid_attention_broadcast, PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=2, temporal_attention_block_skip_range=2,
                cross_attention_block_skip_range=3, spatial_attention_timestep_skip_range=(100, 900),
                temporal_attention_timestep_skip_range=(100, 900), cross_attention_timestep_skip_range=(100, 900),
                current_timestep_callback=now))),
    "first_block": (["sample.cache.threshold=0.3"],
                    lambda now: (apply_first_block_cache, FirstBlockCacheConfig(threshold=0.3))),
    "magcache": (["sample.cache.threshold=0.05", "sample.cache.max_skip_steps=2", f"sample.cache.mag_ratios={RATIOS}"],
                 lambda now: (apply_mag_cache, MagCacheConfig(threshold=0.05, max_skip_steps=2, retention_ratio=0.2,
                                                              num_inference_steps=STEPS, mag_ratios=RATIOS))),
}


def diffusers_hooked(kind, case):
    """``hook(model)`` for ``fast_models.sample``: diffusers' own function of ``kind`` applied to the
    transformer, with the timestep it is called with as PAB's current timestep (on the 0-1000 scale of
    the pipelines' ``current_timestep``: Flux's transformer takes it divided by 1000), sampled in a
    cache context as diffusers' pipelines do."""
    scale = 1000.0 if case == "flux" else 1.0

    def hook(model):
        seen = {}
        model.register_forward_pre_hook(
            lambda m, args, kwargs: seen.update(t=scale * float(kwargs["timestep"].reshape(-1)[0])), with_kwargs=True)
        apply, config = KINDS[kind][1](lambda: seen["t"])
        apply(model, config)
        return inference_context(model)
    return hook


@contextlib.contextmanager
def inference_context(model):
    """What diffusers' pipelines open around their denoising loop (``CacheMixin.cache_context``, which
    SD3's transformer lacks): one cache context on every stateful hook of the model."""
    _set_cache_context(model, CacheContext("inference"))
    try:
        yield
    finally:
        _set_cache_context(model, None)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", CASES)
def test_each_kind_is_diffusers_own_hook_on_every_family(case, kind):
    settings = [f"sample.cache.kind={kind}"] + KINDS[kind][0]
    if case == "flux2" and kind == "first_block":  # its tiny first block changes by more than 0.3 every step
        settings = [f"sample.cache.kind={kind}", "sample.cache.threshold=1.0"]
    got, records = sample(case, settings)
    field = 1 if kind == "pab" else 0  # attention modules (pab) or blocks computed per step
    assert records[0][field] > 0 and any(r[field] < records[0][field] for r in records), f"{case}: {records}"
    if case in ("sd3", "flux2") and kind == "first_block":
        # diffusers 0.42's tail hook subtracts from the None text stream of SD3's last block
        # (context_pre_only), and the head's pair from FLUX.2's one-tensor single-stream last block;
        # sampling's tail hook handles both (FirstBlockTailHook, checked for FLUX.2 below).
        with pytest.raises(TypeError):
            sample(case, hook=diffusers_hooked(kind, case))
        assert torch.isfinite(got).all()
        return
    want, _ = sample(case, hook=diffusers_hooked(kind, case))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    plain, _ = sample(case)
    assert not torch.equal(got, plain), f"{case}: the cache changed nothing"


@pytest.mark.parametrize("case", CASES)
def test_teacache_signal_is_what_the_first_blocks_attention_reads(case):
    """The family's declared signal, computed from the first block's call, against the hidden states
    its attention module is given in that call."""
    seen = {}

    def record(model):
        block = model.get_submodule(family_of(model).block_lists[0])[0]
        attention = getattr(block, "attn1", None) or block.attn
        def first_call(name, value):
            seen.setdefault(name, value)

        block.register_forward_pre_hook(lambda m, args, kwargs: first_call("call", (m, args, kwargs)), with_kwargs=True)
        attention.register_forward_pre_hook(
            lambda m, args, kwargs: first_call("attention", kwargs.get("hidden_states", args[0] if args else None)),
            with_kwargs=True)

    sample(case, hook=record)
    block, args, kwargs = seen["call"]
    signal = family_of(case_class(case)).step_cache.teacache_signal(block, args, kwargs)
    torch.testing.assert_close(signal.float(), seen["attention"].float(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_teacache_skips_as_configured_on_every_family(case):
    """threshold 1 (every small change is reused), at most 2 steps in a row: computed at the first step,
    reused twice, computed, reused, and the last step computed."""
    _, records = sample(case, ["sample.cache.kind=teacache", "sample.cache.threshold=1.0",
                               "sample.cache.max_skip_steps=2"])
    full = records[0][0]
    assert [blocks for blocks, _ in records] == [full, 0, 0, full, 0, full]


def case_class(case: str) -> str:
    return "WanTransformer3DModel" if case == "wan" else FAMILIES[case][0]


def test_first_block_splits_flux2_s_single_stream_residual_into_its_two_streams():
    """FLUX.2's last block returns [text; tokens] as one tensor after a two-stream first block. A step whose
    first block's output is unchanged is skipped and gives, through the stored residuals of both
    streams, exactly the step computed before it; and a changed input is computed again."""
    from opendit_lite.config.schema import CacheConfig
    from opendit_lite.sampling.cache.apply import apply_step_cache
    from opendit_lite.sampling.cache.cache_settings import resolve_cache
    from tests.diffusers_families import build, forward_inputs

    model = build("Flux2Transformer2DModel").eval()
    inputs = forward_inputs("Flux2Transformer2DModel")
    with torch.no_grad():
        plain = model(**inputs)[0]
    cache = apply_step_cache(model, resolve_cache(CacheConfig(kind="first_block", threshold=0.3)), num_steps=3,
                             num_timesteps=1000, announce=lambda line: None)
    call = cache.track(lambda x, t: model(**dict(inputs, hidden_states=x, timestep=t))[0])
    with torch.no_grad(), cache.trajectory():
        computed = call(inputs["hidden_states"], inputs["timestep"])
        skipped = call(inputs["hidden_states"], inputs["timestep"])
        again = call(torch.randn(inputs["hidden_states"].shape, generator=torch.Generator().manual_seed(5)),
                     inputs["timestep"])
    assert [step.blocks for step in cache.steps] == [2, 1, 2]
    torch.testing.assert_close(computed, plain, rtol=0, atol=0)
    torch.testing.assert_close(skipped, computed, rtol=0, atol=1e-6)
    assert not torch.allclose(again, computed)
