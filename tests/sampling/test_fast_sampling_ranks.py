"""CFG-parallel ranks and step caches on gloo ranks give the one-process samples (fp32, 1e-5) and
every rank records the same steps: guidance's two branches on two ranks (DiT, STDiT, Vchitect and the
tiny Wan, SD3, CogVideoX and LTX-Video; Flux and HunyuanVideo are guidance-distilled), on two
sequence-parallel pairs (world 4 = 2 branches x sp 2), and each cache kind with sequence parallelism
and CFG-parallel ranks (STDiT; Wan and SD3 too, whose sequence-parallel plan check lets a forward
that reused work run no attention), where a decision taken from the tensors is agreed over the ranks
that share the batch. The ranks run in the shared spawns of tests/parallel/spawn.py."""

import functools

import pytest
import torch

from opendit_lite.config import ConfigError
from tests.parallel.spawn import rank_checks, results
from tests.sampling.fast_models import sample, sample_on_ranks

CFG = ["sample.cfg_parallel=true"]
CACHES = {  # kind -> settings that make the tiny STDiT reuse the cache at some steps, compute at others
    "pab": ["sample.cache.kind=pab"],
    "first_block": ["sample.cache.kind=first_block", "sample.cache.threshold=0.2"],
    "teacache": ["sample.cache.kind=teacache", "sample.cache.threshold=0.2"],
    "magcache": ["sample.cache.kind=magcache", "sample.cache.threshold=0.1",
                 "sample.cache.mag_ratios=[1.0,1.02,0.99,1.01,0.97,0.9]"],
}

# world size -> {name: (case, overrides)}
RUNS = {
    2: {"dit cfg": ("dit", CFG), "stdit cfg": ("stdit", CFG), "wan cfg": ("wan", CFG),
        **{f"{family} cfg": (family, CFG) for family in ("sd3", "cogvideox", "ltx_video")},
        "dit cfg teacache": ("dit", CFG + CACHES["teacache"]),
        "stdit sp first_block": ("stdit", ["sp_size=2"] + CACHES["first_block"])},
    4: {"dit cfg sp": ("dit", CFG + ["sp_size=2"]), "vchitect cfg sp": ("vchitect", CFG + ["sp_size=2"]),
        **{f"stdit cfg sp {kind}": ("stdit", CFG + ["sp_size=2"] + settings) for kind, settings in CACHES.items()},
        "wan cfg sp teacache": ("wan", CFG + ["sp_size=2"] + CACHES["teacache"]),
        "wan cfg sp pab": ("wan", CFG + ["sp_size=2"] + CACHES["pab"]),
        "sd3 cfg sp first_block": ("sd3", CFG + ["sp_size=2"] + CACHES["first_block"])},
}


def _runs(rank, world_size):
    torch.manual_seed(100 + rank)  # the global RNG must not matter
    return {name: sample_on_ranks(case, overrides) for name, (case, overrides) in RUNS[world_size].items()}


rank_checks("fast sampling", 2)(_runs)
rank_checks("fast sampling", 4)(_runs)


@functools.lru_cache(maxsize=None)
def one_process(case: str, overrides: tuple):
    return sample(case, list(overrides))


@pytest.mark.parametrize("world, name", [(w, n) for w, runs in RUNS.items() for n in runs])
def test_ranks_give_the_one_process_samples_and_skip_the_same_steps(world, name):
    case, overrides = RUNS[world][name]
    want, want_steps = one_process(case, tuple(o for o in overrides if o not in CFG and not o.startswith("sp_size")))
    for rank, per_rank in enumerate(results("fast sampling", world)):
        got, steps = per_rank[name]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=lambda m: f"{name}, rank {rank}: {m}")
        assert steps == want_steps, f"{name}: rank {rank} computed {steps}, one process {want_steps}"
    if want_steps is not None:
        assert any(blocks < 2 or attention < 6 for blocks, attention in want_steps), f"{name}: nothing was reused"


def test_cfg_parallel_is_refused_without_an_unconditional_branch():
    from opendit_lite.families import FamilyDenoiser, family_adapter
    from opendit_lite.sampling.cfg_parallel import check_cfg_parallel

    flux_dev = FamilyDenoiser(family_adapter("FluxTransformer2DModel"), torch.nn.Linear(1, 1),
                              {"guidance_embeds": True}, 8, 32)
    with pytest.raises(ConfigError, match="distilled from classifier-free guidance"):
        check_cfg_parallel(flux_dev, 4.0)
    with pytest.raises(ConfigError, match="declares no guided forward"):
        check_cfg_parallel(torch.nn.Linear(1, 1), 4.0)
    for scale, branch in ((1.0, "conditional"), (0.0, "unconditional")):
        with pytest.raises(ConfigError, match=f"returns the {branch} prediction alone"):
            sample("dit", CFG + [f"sample.cfg_scale={scale}"])
