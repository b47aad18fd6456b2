"""On one GPU (world size 1, NCCL): Gemini (zero_degree 3) and grouped ZeRO train, and their EMA
follows the fp32 masters; DDP under bf16 autocast with torch's fused AdamW. bf16 weights, so the
comparison with the fp32 single-process reference is loose (a few bf16 ulps of drift per step)."""

import pytest
import torch
import torch.distributed as dist

from tests.plugins.common import boosted_run, max_diff, reference_run

pytestmark = pytest.mark.gpu

STEPS = 3
BF16_TOL = 2e-2

CONFIGS = {
    "gemini": dict(zero_degree=3),
    "gemini_grouped": dict(zero_degree=3, group_zero=True),
    # Small chunks, so that they are sharded (not kept gathered) and the optimizer chunks can move
    # to the CPU, taking the EMA with them.
    "gemini_chunked_offload": dict(zero_degree=3, gemini_offload_optim_frac=1.0,
                                   gemini_kwargs=dict(min_chunk_size_m=0.01)),
    "zero2_grouped": dict(zero_degree=2, group_zero=True),
    "zero1_grouped_clip": dict(zero_degree=1, group_zero=True, grad_clip=0.05),
    "ddp_bf16": dict(zero_degree=0),
}


@pytest.fixture
def nccl_world_of_one():
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_trains_on_one_gpu_with_ema(nccl_world_of_one, name):
    from opendit_lite.plugins import OpenDiTPlugin

    kwargs = CONFIGS[name]
    plugin = OpenDiTPlugin(precision="bf16", **kwargs)
    model, _ = boosted_run(plugin, STEPS)
    ref_params, ref_ema = reference_run(STEPS, grad_clip=kwargs.get("grad_clip", 0.0))

    if kwargs["zero_degree"] == 3:
        weights = model.state_dict(only_rank_0=False)  # Gemini gathers its chunks
    else:
        weights = {n: p for n, p in model.unwrap().named_parameters()}
    weights = {k: weights[k] for k in ref_params}
    assert max_diff(weights, ref_params) < BF16_TOL
    assert max_diff(weights, reference_run(0)[0]) > 1e-4, "the weights did not move"

    ema = plugin.ema.state_dict()
    assert list(ema) == list(model.unwrap().state_dict())
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in ema.values())
    assert max_diff({k: ema[k] for k in ref_ema}, ref_ema) < BF16_TOL
    total = sum(v.numel() for v in ref_ema.values())
    assert total <= plugin.ema.numel_local() <= 1.5 * total  # world of one: all of it (+ chunk tails)
