"""Sequence parallelism of FLUX.1 Kontext's inputs (a variant of the Flux family: the same transformer and
sequence-parallel spec): the pipeline joins the reference's tokens to the target's before the transformer, so
the spec's split of ``hidden_states`` and ``img_ids`` splits both together; 21 tokens (15 target, 6 reference)
are uneven at sp 2. Ulysses, ring and USP over 2 gloo ranks against the serial model: the gathered output,
the world-mean gradients and the parameters after one SGD step (``compare`` of test_diffusers_families.py,
in its shared 2-rank spawn)."""

import warnings

from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results
from tests.parallel.test_diffusers_families import TOL, compare

MODES = {"ulysses": {}, "ring": {}, "usp ring 2": dict(ring_size=2), "usp ring 1": dict(ring_size=1)}


@rank_checks("flux kontext", world_size=2)
def _world2(rank, world_size):
    warnings.filterwarnings("ignore")
    return {name: compare("flux", 2, name.split()[0], variant="kontext", **kw) for name, kw in MODES.items()}


def test_kontext_reference_tokens_split_with_the_target_at_sp2():
    per_rank = spawn_results("flux kontext", 2)
    for name in MODES:
        for rank, results in enumerate(per_rank):
            r = results[name]
            assert r["missing"] == [], f"{name}: gradients on one side only: {r['missing']}"
            for what in ("out", "grad", "step"):
                assert r[what] < TOL, f"{name} (rank {rank}): {what} differs by {r[what]:.2e} (relative)"
    reports = {name: per_rank[0][name]["report"] for name in MODES}
    assert "input 'hidden_states' along dim 1, padded to a multiple of 2" in reports["ulysses"]
    assert "ulysses over 2 ranks" in reports["ulysses"] and "ring over 2 ranks" in reports["ring"]
    assert "usp (ring 2 x ulysses 1)" in reports["usp ring 2"] and "usp (ring 1 x ulysses 2)" in reports["usp ring 1"]
    print("\n" + ", ".join(f"{name}: out {max(r[name]['out'] for r in per_rank):.1e} grad "
                           f"{max(r[name]['grad'] for r in per_rank):.1e}" for name in MODES))
