"""Step caches (``sample.cache``) on one process: each kind skips what its rule says, against a
reference of the rule written here (Pyramid Attention Broadcast's recompute pattern; First-Block-Cache,
TeaCache and MagCache as explicit block loops over DiT-T/2), with the reference's samples; MagCache's
calibration; and the settings' defaults. The diffusers families are in test_family_caches.py, the
rank agreement of every kind in test_fast_sampling_ranks.py, the errors in test_fast_errors.py."""


import pytest
import torch

from opendit_lite.config import ConfigError
from opendit_lite.diffusion import cfg_model_fn
from opendit_lite.sampling.cache import resolve_cache
from opendit_lite.sampling.fast import PLAIN
from tests.sampling.fast_models import STEPS, case_config, perturb, sample

TIMES = [1000.0 * (1 - i / STEPS) for i in range(STEPS)]  # Euler's model timesteps (no shift)


# ------------------------------------------------------------------------------------------------
# Pyramid Attention Broadcast: the recompute pattern of each attention kind
# ------------------------------------------------------------------------------------------------

def pab_pattern(skip: int, window) -> list:
    """Whether an attention of recompute range ``skip`` runs at each step (diffusers' rule)."""
    return [i == 0 or not window[0] < TIMES[i] < window[1] or i % skip == 0 for i in range(STEPS)]


def test_pab_recomputes_each_attention_kind_every_nth_step_inside_the_window():
    window = [150, 900]
    settings = ["sample.cache.kind=pab", "sample.cache.spatial_skip=2", "sample.cache.temporal_skip=3",
                "sample.cache.cross_skip=4", f"sample.cache.timesteps={window}"]
    out, records = sample("stdit", settings)
    # STDiT-tiny: 2 blocks, each with one spatial, one temporal and one cross-attention.
    want = [2 * (s + t + c) for s, t, c in zip(pab_pattern(2, window), pab_pattern(3, window), pab_pattern(4, window))]
    assert [attention for _, attention in records] == want
    assert min(want) < 6 and torch.isfinite(out).all()
    plain, _ = sample("stdit")
    assert not torch.equal(out, plain)  # reused attention changes the samples


# ------------------------------------------------------------------------------------------------
# Block-level caches against explicit block loops over DiT-T/2
# ------------------------------------------------------------------------------------------------

class ReferenceDiT:
    """DiT-T/2's forward as a loop over its blocks, with the caching rule ``rule(step, x, c)`` deciding
    per call how many blocks run: "all", "first" (the rest replaced by the last residual of blocks
    1..N) or "none" (every block replaced by the last residual of the whole stack)."""

    def __init__(self, model):
        self.model, self.step, self.computed = model, 0, []
        self.head_residual = self.tail_residual = self.stack_residual = None

    def __call__(self, x, t, y):
        m = self.model
        h = m.x_embedder(x) + m.pos_embed                                  # [B, N, D]
        c = m.t_embedder(t) + m.y_embedder(y, False)                       # [B, D]
        h = self.blocks(h, c)
        self.step += 1
        return m.unpatchify(m.final_layer(h, c))


class ReferenceFirstBlock(ReferenceDiT):
    def __init__(self, model, threshold):
        super().__init__(model)
        self.threshold = threshold

    def blocks(self, h, c):
        first = self.model.blocks[0](h, c)
        residual, previous = first - h, self.head_residual
        if previous is not None and (residual - previous).abs().sum() / previous.abs().sum() <= self.threshold:
            self.computed.append(1)
            return first + self.tail_residual
        self.head_residual, out = residual, first
        for block in self.model.blocks[1:]:
            out = block(out, c)
        self.tail_residual = out - first
        self.computed.append(len(self.model.blocks))
        return out


class ReferenceTeaCache(ReferenceDiT):
    def __init__(self, model, threshold, max_skip):
        super().__init__(model)
        self.threshold, self.max_skip, self.signal, self.accumulated, self.skipped = threshold, max_skip, None, 0.0, 0

    def blocks(self, h, c):
        block0 = self.model.blocks[0]
        shift, scale = block0.adaLN_modulation(c).chunk(6, dim=1)[:2]
        signal, previous = block0.norm1(h, shift, scale), self.signal
        self.signal = signal
        if previous is None or self.stack_residual is None or self.step == STEPS - 1:
            self.accumulated, self.skipped = 0.0, 0
        else:
            self.accumulated += ((signal - previous).abs().sum() / previous.abs().sum()).item()
            if self.accumulated < self.threshold and self.skipped < self.max_skip:
                self.skipped += 1
                self.computed.append(0)
                return h + self.stack_residual
            self.accumulated, self.skipped = 0.0, 0
        return self.run_all(h, c)

    def run_all(self, h, c):
        out = h
        for block in self.model.blocks:
            out = block(out, c)
        self.stack_residual = out - h
        self.computed.append(len(self.model.blocks))
        return out


class ReferenceMagCache(ReferenceTeaCache):
    def __init__(self, model, threshold, max_skip, retention, ratios):
        super().__init__(model, threshold, max_skip)
        self.retention, self.ratios, self.ratio = int(retention * STEPS + 0.5), ratios, 1.0

    def blocks(self, h, c):
        if self.step >= self.retention:
            self.ratio *= self.ratios[self.step]
            self.skipped += 1
            self.accumulated += abs(1.0 - self.ratio)
            if self.stack_residual is not None and self.accumulated <= self.threshold and self.skipped <= self.max_skip:
                self.computed.append(0)
                return h + self.stack_residual
            self.ratio, self.skipped, self.accumulated = 1.0, 0, 0.0
        return self.run_all(h, c)


def reference_samples(reference, settings):
    """The tiny DiT case sampled with ``reference`` in place of the model (same noise and labels)."""
    from opendit_lite.models import build_model
    from opendit_lite.sampling.image import sample_images

    cfg = case_config("dit", settings)
    model = build_model("DiT-T/2", input_size=8, in_channels=3, num_classes=3, learn_sigma=False).eval()
    perturb(model, 7)
    runner = reference(model)

    class Fast:  # the reference where the sampler would call the model
        def guided(self, m, cfg_scale, channels=None):
            return cfg_model_fn(m, cfg_scale, channels=channels, runner=runner)

        trajectory = PLAIN.trajectory

    with torch.no_grad():
        out = sample_images(model, cfg, torch.tensor([2, 0]), [0, 1], "cpu", fast=Fast())
    return out, runner.computed


RATIOS = [1.0, 1.02, 0.99, 1.01, 0.97, 0.9]
BLOCK_CASES = {
    "first_block": (["sample.cache.threshold=0.2"], lambda m: ReferenceFirstBlock(m, 0.2)),
    "teacache": (["sample.cache.threshold=0.2", "sample.cache.max_skip_steps=2"],
                 lambda m: ReferenceTeaCache(m, 0.2, 2)),
    "magcache": (["sample.cache.threshold=0.05", "sample.cache.max_skip_steps=2", "sample.cache.retention_ratio=0.2",
                  f"sample.cache.mag_ratios={RATIOS}"], lambda m: ReferenceMagCache(m, 0.05, 2, 0.2, RATIOS)),
}


@pytest.mark.parametrize("kind", list(BLOCK_CASES))
def test_block_caches_skip_as_their_rule_says(kind):
    settings, reference = BLOCK_CASES[kind]
    got, records = sample("dit", [f"sample.cache.kind={kind}"] + settings)
    want, computed = reference_samples(reference, settings)
    assert [blocks for blocks, _ in records] == computed
    assert 0 < computed.count(2) < STEPS, f"{kind}: some steps must reuse the cache, some compute: {computed}"
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_magcache_calibrates_on_the_first_trajectory_then_skips(capsys):
    """No mag_ratios: the first batch runs in full while the residual magnitude ratios are measured
    (diffusers' formula: mean over tokens of |r_i| / |r_i-1|), the next batches skip with them."""
    from opendit_lite.models import build_model
    from opendit_lite.sampling.fast import fast_sampling
    from opendit_lite.sampling.image import sample_images
    from opendit_lite.sampling.sharding import _single_process

    cfg = case_config("dit", ["sample.cache.kind=magcache", "sample.cache.threshold=0.3"])
    model = build_model("DiT-T/2", input_size=8, in_channels=3, num_classes=3, learn_sigma=False).eval()
    perturb(model, 7)
    residuals = []
    model.blocks[-1].register_forward_hook(lambda mod, args, out: residuals.append(out))
    model.blocks[0].register_forward_pre_hook(lambda mod, args: residuals.append(args[0]))
    fast = fast_sampling(model, cfg, _single_process())
    with torch.no_grad():
        sample_images(model, cfg, torch.tensor([2, 0]), [0, 1], "cpu", fast=fast)
        assert [blocks for blocks, _ in [(s.blocks, 0) for s in fast.cache.steps]] == [2] * STEPS
        stack = [out - inp for inp, out in zip(residuals[0::2], residuals[1::2])]
        want = [1.0] + [(torch.linalg.norm(b, dim=-1) / (torch.linalg.norm(a, dim=-1) + 1e-8)).mean().item()
                        for a, b in zip(stack, stack[1:])]
        assert fast.cache.settings["mag_ratios"] == pytest.approx(want, rel=1e-5)
        sample_images(model, cfg, torch.tensor([2, 0]), [0, 1], "cpu", fast=fast)
    assert any(s.blocks == 0 for s in fast.cache.steps)
    out = capsys.readouterr().out
    assert "first batch is sampled in full" in out and "sample.cache.mag_ratios=[1.0000," in out


# ------------------------------------------------------------------------------------------------
# Settings and the models a cache cannot hook
# ------------------------------------------------------------------------------------------------

def test_each_kind_takes_its_defaults_and_refuses_the_settings_of_another():
    cfg = case_config("dit", ["sample.cache.kind=teacache"])
    assert resolve_cache(cfg.sample.cache) == {"kind": "teacache", "threshold": 0.1, "max_skip_steps": 1}
    for settings, words in ((["sample.cache.kind=pab", "sample.cache.threshold=0.1"], "threshold is read by kind"),
                            (["sample.cache.threshold=0.1"], "kind=none reads no settings"),
                            (["sample.cache.kind=pab", "sample.cache.timesteps=[800,100]"], "low < high")):
        with pytest.raises(ConfigError, match=words):
            resolve_cache(case_config("dit", settings).sample.cache)


def test_a_cache_with_compile_is_refused():
    with pytest.raises(ConfigError, match="sample.compile=true"):
        sample("dit", ["sample.cache.kind=pab", "sample.compile=true"])
