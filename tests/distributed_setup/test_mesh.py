"""The data x sequence mesh: consecutive SP groups, strided DP groups, batches sharded over DP only
(identical inside an SP group, random worker augmentations included), and grouped ZeRO with real
shard groups and replicas (world 4: two "nodes" of two ranks) combined with sp_size 2."""

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from tests.distributed import run_distributed
from tests.plugins.common import boosted_run, max_diff, reference_run
from tests.zero_cpu_shim import install as install_zero_cpu_shim


class IndexWithNoise(Dataset):
    """Sample i: (i, a random number drawn in the worker, like a random crop or flip would be)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return i, torch.rand(())


def _members(group):
    ranks = [None] * dist.get_world_size(group)
    dist.all_gather_object(ranks, dist.get_rank(), group=group)
    return ranks


def _mesh_checks(rank, world_size, sp_sizes, train_grouped):
    from opendit_lite.plugins import OpenDiTPlugin

    out = {}
    for sp in sp_sizes:
        plugin = OpenDiTPlugin(zero_degree=0, sp_size=sp, precision="fp32")
        # fork: a spawned worker would re-import this module and Colossal-AI (seconds per loader).
        loader = plugin.prepare_dataloader(IndexWithNoise(), batch_size=4, seed=7, num_workers=1,
                                           multiprocessing_context="fork")
        batches = [(idx.tolist(), noise.tolist()) for idx, noise in loader]
        out[sp] = dict(
            dp=(plugin.dp_rank, plugin.dp_size), sp=(plugin.sp_rank, plugin.sp_size), batches=batches,
            sp_members=_members(plugin.sp_group), dp_members=_members(plugin.dp_group),
        )
    try:
        OpenDiTPlugin(sp_size=3)
    except ValueError as err:
        out["sp3_error"] = str(err)
    if train_grouped:
        install_zero_cpu_shim()
        plugin = OpenDiTPlugin(zero_degree=2, sp_size=2, precision="fp32", group_zero=True, node_size=2)
        model, _ = boosted_run(plugin, steps=2)
        ref_params, ref_ema = reference_run(steps=2)
        ema = plugin.ema.state_dict()
        out["grouped"] = dict(
            params=max_diff({n: p.detach() for n, p in model.unwrap().named_parameters()}, ref_params),
            ema=max_diff({k: ema[k] for k in ref_ema}, ref_ema),
            zero_members=_members(plugin.zero_group), replica_members=_members(plugin.replica_group),
        )
    return out


def _check_sharding(results, sp):
    for a, ra in enumerate(results):
        for b, rb in enumerate(results):
            same_dp = ra[sp]["dp"][0] == rb[sp]["dp"][0]
            assert same_dp == (a // sp == b // sp), (a, b, ra[sp]["dp"], rb[sp]["dp"])
            if same_dp:
                assert ra[sp]["batches"] == rb[sp]["batches"], \
                    f"ranks {a}, {b} share an SP group but got different batches"
            else:
                idx_a = {i for idx, _ in ra[sp]["batches"] for i in idx}
                idx_b = {i for idx, _ in rb[sp]["batches"] for i in idx}
                assert not idx_a & idx_b, f"DP ranks {a}, {b} read the same samples {sorted(idx_a & idx_b)}"
                noise_a = [v for _, noise in ra[sp]["batches"] for v in noise]
                noise_b = [v for _, noise in rb[sp]["batches"] for v in noise]
                assert noise_a != noise_b
    world = len(results)
    for rank, res in enumerate(results):
        assert res[sp]["sp_members"] == list(range(rank // sp * sp, rank // sp * sp + sp))
        assert res[sp]["dp_members"] == list(range(rank % sp, world, sp))
        assert res[sp]["dp"] == (rank // sp, world // sp) and res[sp]["sp"] == (rank % sp, sp)
        # 64 samples, dp_size shards, 4 per batch, drop_last.
        assert len(res[sp]["batches"]) == 64 // (world // sp) // 4


@pytest.mark.slow
def test_world2_sp1_and_sp2():
    results = run_distributed(_mesh_checks, 2, args=((1, 2), False))
    _check_sharding(results, 1)
    _check_sharding(results, 2)
    assert "divisor of the world size 2" in results[0]["sp3_error"] and "[1, 2]" in results[0]["sp3_error"]


@pytest.mark.slow
def test_world4_dp2_sp2_and_grouped_zero():
    results = run_distributed(_mesh_checks, 4, args=((2,), True))
    _check_sharding(results, 2)
    for rank, res in enumerate(results):
        g = res["grouped"]
        assert g["params"] < 2e-6 and g["ema"] < 2e-6, (rank, g)
        assert g["zero_members"] == [rank // 2 * 2, rank // 2 * 2 + 1]  # shard inside the "node"
        assert g["replica_members"] == [rank % 2, rank % 2 + 2]          # replicate across "nodes"
