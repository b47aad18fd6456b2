"""Sequence parallelism of Z-Image (``ZImageTransformer2DModel``, whose forward builds its sequences from
per-sample lists) against the serial model at 2 gloo ranks, fp32: Ulysses, ring and USP each give the
gathered output and every parameter's world-mean gradient of the serial model (relative 1e-4, as
tests/parallel/test_diffusers_families.py measures them), on a batch whose two captions pad to
different lengths (the joint sequence's key mask is split and gathered) and whose image tokens (15)
are padded by the model to 32. The refiners run whole on every rank; the Omni layout is refused.

Run with -s to see the largest differences."""

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.parallel import tiny_families as fam
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

TOL = 1e-4
MODES = (("ulysses", None), ("ring", None), ("usp", 2))


def _inputs(model, seed: int = 10) -> dict:
    """Two samples of 6 x 10 latents (15 patches of 2 x 2) and captions of 7 and 40 tokens."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    return dict(x=[torch.randn(cfg.in_channels, 1, 6, 10, generator=g) for _ in range(2)],
                t=torch.rand(2, generator=g),
                cap_feats=[torch.randn(n, cfg.cap_feat_dim, generator=g) for n in (7, 40)], return_dict=False)


def _forward(model) -> torch.Tensor:
    out = torch.stack(model(**_inputs(model))[0])                                   # [B, C, 1, h, w]
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(1000))
    F.mse_loss(out, target).backward()
    return out.detach()


def _rel(a: torch.Tensor, b: torch.Tensor, floor: float) -> float:
    return (a - b).abs().max().item() / max(b.abs().max().item(), floor)


def _case(mode: str, ring_size) -> dict:
    from opendit_lite.parallelization import parallelize

    serial = fam.build("z_image")
    ref = _forward(serial)
    ref_grads = {n: p.grad for n, p in serial.named_parameters() if p.grad is not None}
    model = fam.build("z_image")
    parallelize(model, sp_group=dist.group.WORLD, sp_mode=mode, sp_ring_size=ring_size)
    out = _forward(model)
    grads = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            grads[n] = p.grad.div_(dist.get_world_size())
    gmax = max(g.abs().max().item() for g in ref_grads.values())
    return {"out": _rel(out, ref, 1e-30), "missing": sorted(set(ref_grads) ^ set(grads)),
            "grad": max(_rel(grads[n], g, 1e-3 * gmax) for n, g in ref_grads.items() if n in grads)}


def _omni_refused() -> str:
    from opendit_lite.parallelization import parallelize

    try:
        parallelize(fam.build("z_image", siglip_feat_dim=8), sp_group=dist.group.WORLD, sp_mode="ulysses")
    except Exception as e:  # noqa: BLE001  (the message is what the test reads)
        return f"{type(e).__name__}: {e}"
    return "not refused"


@rank_checks("z_image sequence parallel", world_size=2)
def _world2(rank, world_size):
    warnings.filterwarnings("ignore")
    out = {f"{mode}": _case(mode, ring) for mode, ring in MODES}
    out["omni"] = _omni_refused()
    return out


def test_z_image_sequence_parallel_equals_one_process():
    per_rank = spawn_results("z_image sequence parallel", 2)
    print({k: {m: f"{v:.1e}" for m, v in r.items() if m != "missing"} if isinstance(r, dict) else r
           for k, r in per_rank[0].items()})
    for results in per_rank:
        for mode, _ in MODES:
            r = results[mode]
            assert r["missing"] == [], f"{mode}: gradients on one side only: {r['missing']}"
            assert r["out"] < TOL and r["grad"] < TOL, f"{mode}: {r}"
        assert "Omni layout" in results["omni"] and "sp_size=1" in results["omni"], results["omni"]

