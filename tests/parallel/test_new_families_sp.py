"""Ulysses, ring and USP for Qwen-Image, Z-Image, FLUX.2 and HunyuanVideo 1.5 at 2 and 4 ranks against one
process, fp32, completing what tests/parallel/test_diffusers_families.py (ring at sp 2 and 4, Ulysses at sp 2
through the plugin, USP 2 x 2 for FLUX.2 and HunyuanVideo 1.5) and test_z_image_sp.py (every mode at sp 2)
check, with their comparison (output, every parameter's world-mean gradient and the parameters after one
SGD step, relative 1e-4), at 4 ranks: Ulysses at sp 4 for each of the four (4 heads: the tiny models' 2
cannot be split 4 ways), USP as ring 2 x Ulysses 2 for Qwen-Image, and ring and USP 2 x 2 for Z-Image
(the others' ring at sp 4 and USP 2 x 2 are test_diffusers_families.py's).

The checks run in the shared 4-rank spawn (``spawn.py``): no process of their own.
Run with -s to see the largest differences."""

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.parallel import tiny_families as fam
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results
from tests.parallel.test_diffusers_families import TOL, _errors, _mesh, _rel, _target

# 4 heads of the same width (the rotary axes fix it)
FOUR_HEADS = {"qwen_image": dict(num_attention_heads=4), "flux2": dict(num_attention_heads=4),
              "hunyuan_video15": dict(num_attention_heads=4), "z_image": dict(n_heads=4, n_kv_heads=4, dim=64)}


def _world_mean_grads(model) -> dict:
    grads = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            grads[n] = p.grad.div_(dist.get_world_size())
    return grads


def compare(family: str, sp_size: int, mode: str, ring_size=None, heads: bool = False, lr: float = 10.0) -> dict:
    """test_diffusers_families.compare with the model's heads set to 4 (``heads``): parallelize over SP groups
    of ``sp_size`` vs serial, one forward, backward and SGD step on the "uneven" batches."""
    from opendit_lite.parallelization import parallelize

    overrides = FOUR_HEADS[family] if heads else {}
    sp_group, dp_rank, dp_size = _mesh(sp_size)
    serial = fam.build(family, **overrides)
    before = {n: p.detach().clone() for n, p in serial.named_parameters()}
    ref_outs = []
    for d in range(dp_size):
        out = serial(**fam.inputs(family, serial, seed=10 + d))[0]
        (F.mse_loss(out, _target(out, d)) / dp_size).backward()
        ref_outs.append(out.detach())
    ref_grads = {n: p.grad.clone() for n, p in serial.named_parameters() if p.grad is not None}
    torch.optim.SGD(serial.parameters(), lr=lr).step()

    model = fam.build(family, **overrides)
    report = parallelize(model, sp_group=sp_group, sp_mode=mode, sp_ring_size=ring_size)
    out = model(**fam.inputs(family, model, seed=10 + dp_rank))[0]
    F.mse_loss(out, _target(out, dp_rank)).backward()
    grads = _world_mean_grads(model)
    torch.optim.SGD(model.parameters(), lr=lr).step()
    errors = _errors(out.detach(), ref_outs[dp_rank], grads, ref_grads, dict(model.named_parameters()),
                     dict(serial.named_parameters()), before)
    return {**errors, "report": str(report)}


def compare_z_image(mode: str, ring_size=None, heads: bool = False) -> dict:
    """Z-Image (per-sample lists; test_z_image_sp.py's batch: captions of 7 and 40 tokens, 15 image tokens)
    over every rank against serial: output and every parameter's world-mean gradient."""
    from opendit_lite.parallelization import parallelize
    from tests.parallel.test_z_image_sp import _forward

    overrides = FOUR_HEADS["z_image"] if heads else {}
    serial = fam.build("z_image", **overrides)
    ref = _forward(serial)
    ref_grads = {n: p.grad for n, p in serial.named_parameters() if p.grad is not None}
    model = fam.build("z_image", **overrides)
    report = parallelize(model, sp_group=dist.group.WORLD, sp_mode=mode, sp_ring_size=ring_size)
    out = _forward(model)
    grads = _world_mean_grads(model)
    gmax = max(g.abs().max().item() for g in ref_grads.values())
    return {"out": _rel(out, ref, 1e-30), "missing": sorted(set(ref_grads) ^ set(grads)), "step": 0.0,
            "grad": max(_rel(grads[n], g, 1e-3 * gmax) for n, g in ref_grads.items() if n in grads),
            "report": str(report)}


@rank_checks("new families sp", world_size=4)
def _world4(rank, world_size):
    warnings.filterwarnings("ignore")
    out = {f"{f}/ulysses sp4": compare(f, 4, "ulysses", heads=True) for f in ("qwen_image", "flux2", "hunyuan_video15")}
    out["qwen_image/usp sp4 ring 2"] = compare("qwen_image", 4, "usp", ring_size=2)
    out["z_image/ulysses sp4"] = compare_z_image("ulysses", heads=True)
    out["z_image/ring sp4"] = compare_z_image("ring")
    out["z_image/usp sp4 ring 2"] = compare_z_image("usp", ring_size=2)
    return out


def _worst() -> dict:
    per_rank = spawn_results("new families sp", 4)
    return {key: {**per_rank[0][key], **{k: max(r[key][k] for r in per_rank) for k in ("out", "grad", "step")}}
            for key in per_rank[0]}


def test_ulysses_ring_and_usp_at_4_ranks_equal_one_process():
    results = _worst()
    print({k: {m: f"{r[m]:.1e}" for m in ("out", "grad", "step")} for k, r in results.items()})
    for key, r in results.items():
        assert r["missing"] == [], f"{key}: gradients on one side only: {r['missing']}"
        for what in ("out", "grad", "step"):
            assert r[what] < TOL, f"{key}: {what} differs by {r[what]:.2e} (relative)"
    for family in ("qwen_image", "flux2", "hunyuan_video15", "z_image"):
        assert "ulysses over 4 ranks" in results[f"{family}/ulysses sp4"]["report"], family
    for key in ("qwen_image/usp sp4 ring 2", "z_image/usp sp4 ring 2"):
        assert "usp (ring 2 x ulysses 2) over 4 ranks" in results[key]["report"], results[key]["report"]
    assert "ring over 4 ranks" in results["z_image/ring sp4"]["report"], results["z_image/ring sp4"]["report"]
