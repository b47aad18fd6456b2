"""``sample.cfg_parallel`` and ``sample.cache`` settings that cannot apply stop the sampling scripts with
exit code 2 and one paragraph on stderr, no traceback: an unknown cache kind or a threshold out of
range, CFG-parallel ranks with a world size that does not divide into two branches, CFG-parallel
ranks on a model without an unconditional branch (Flux-dev, guidance-distilled), and a cache on a
model it cannot hook."""

import sys

import pytest
import torch

from opendit_lite.sampling.cache import apply_step_cache, resolve_cache
from opendit_lite.utils.exit_codes import script_main
from tests.sampling.fast_models import ROOT, STEPS, case_config, sample

DEMO = ["--config", f"{ROOT}/configs/demo.yaml"]


def exits_2(capsys, run) -> str:
    """The one paragraph ``run()`` stops with, as a script's ``main`` reports it (exit code 2)."""
    with pytest.raises(SystemExit) as stop:
        script_main(lambda argv: run())([])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def sample_script(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)
    import sample

    yield sample
    sys.modules.pop("sample", None)


@pytest.mark.parametrize("setting, words", [
    ("sample.cache.kind=fastest", "'sample.cache.kind' must be one of 'none', 'pab'"),
    ("sample.cache.threshold=1.5", "'sample.cache.threshold' must lie in (0, 1]"),
    ("sample.cache.threshold=0", "'sample.cache.threshold' must lie in (0, 1]"),
    ("sample.cache.spatial_skip=0", "'sample.cache.spatial_skip' must lie in [1, 50]"),
])
def test_bad_cache_settings(setting, words, capsys, sample_script):
    kind = [] if "kind" in setting else ["sample.cache.kind=teacache" if "threshold" in setting else
                                         "sample.cache.kind=pab"]
    assert words in exits_2(capsys, lambda: sample_script.main(DEMO + kind + [setting]))


@pytest.mark.parametrize("world, sp", [("1", 1), ("3", 1), ("6", 2)])
def test_cfg_parallel_with_a_world_that_does_not_divide(world, sp, capsys, monkeypatch, sample_script):
    monkeypatch.setenv("WORLD_SIZE", world)
    err = exits_2(capsys, lambda: sample_script.main(DEMO + ["sample.cfg_parallel=true", f"sp_size={sp}"]))
    assert f"multiple of 2 x {sp}" in err and f"this launch has {world}" in err


def test_cfg_parallel_on_a_guidance_distilled_family(capsys):
    """The tiny Flux has guidance_embeds (Flux-dev): its one prediction already carries the guidance."""
    err = exits_2(capsys, lambda: sample("flux", ["sample.cfg_parallel=true"]))
    assert "FluxTransformer2DModel is distilled from classifier-free guidance" in err


def test_a_cache_on_a_model_it_cannot_hook(capsys):
    class Streams(torch.nn.Linear):  # a block whose tokens a cache finds, without TeaCache's signal
        cache_streams = ("input",)

    class Plain(torch.nn.Module):  # repeated blocks; with_streams: blocks that declare their tokens
        def __init__(self, with_streams=False):
            super().__init__()
            self.blocks = torch.nn.ModuleList([(Streams if with_streams else torch.nn.Linear)(4, 4) for _ in range(2)])

    for kind, words, model in (
            ("first_block", "neither in diffusers' TransformerBlockRegistry nor declare cache_streams", Plain()),
            ("magcache", "neither in diffusers' TransformerBlockRegistry nor declare cache_streams", Plain()),
            ("pab", "none of its attention modules declares its attention_kind", Plain()),
            ("teacache", "(Streams) does not declare (modulated_input)", Plain(with_streams=True))):
        settings = resolve_cache(case_config("dit", [f"sample.cache.kind={kind}"]).sample.cache)
        err = exits_2(capsys, lambda: apply_step_cache(model, settings, num_steps=STEPS, num_timesteps=1000))
        assert f"sample.cache.kind={kind} cannot hook Plain" in err and words in err
