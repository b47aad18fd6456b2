"""Wan 2.2 A14B's two experts as one module (``models/experts.py``): each sample of a batch goes to
the expert WanPipeline runs at its timestep (captured from the tiny Wan 2.2 pipeline's own calls),
a batch split between the experts gives each sample its expert's output and gradients, an expert
with no sample gets zero (not missing) gradients, LoRA and parallelize treat each expert as a model,
and one expert alone trains on its own noise range; under DDP (no find_unused_parameters) ranks
whose samples fall on different experts step together, and under Ulysses sequence parallelism the
split batch gives the serial outputs."""

import pytest
import torch

from opendit_lite.diffusion.rectified_flow import RectifiedFlow
from opendit_lite.models.experts import NoiseExperts, expert_time_range
from opendit_lite.parallelization import parallelize
from tests.diffusers_families import batch_slice, build, forward_inputs

FAMILY = "WanTransformer3DModel"
BOUNDARY = 875.0


def experts(lora: int = 0, sp_group=None, **settings) -> NoiseExperts:
    """The two tiny experts through ``parallelize`` (``settings``: its other keyword arguments)."""
    model = NoiseExperts(build(FAMILY, seed=0), build(FAMILY, seed=3), boundary=BOUNDARY)
    parallelize(model, lora_rank=lora, lora_alpha=4.0, sp_group=sp_group, **settings)
    if lora:
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def split_batch(timesteps):
    inputs = forward_inputs(FAMILY, batch=len(timesteps))
    inputs["timestep"] = torch.tensor(timesteps)
    return inputs


def call(model, inputs):
    return model(**{**inputs, "return_dict": False})[0]


def test_wan_pipeline_runs_the_expert_whose_range_holds_the_timestep(tiny_pipeline):
    from diffusers import WanPipeline

    from opendit_lite.families.tiny_pipelines import TINY_CALLS
    from tests.families.pipeline_capture import capture

    pipe = WanPipeline.from_pretrained(tiny_pipeline("wan22"))
    boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
    calls = capture(pipe, "a red square moving right", **TINY_CALLS["wan22"]).calls
    assert {c.component for c in calls} == {"transformer", "transformer_2"}  # the tiny schedule crosses the boundary
    model = NoiseExperts(pipe.transformer, pipe.transformer_2, boundary=boundary)
    with torch.no_grad():
        for c in calls:
            expert = getattr(pipe, c.component)
            torch.testing.assert_close(call(model, c.kwargs), call(expert, c.kwargs), rtol=0, atol=0)


def test_a_split_batch_gives_each_sample_its_experts_output_and_gradients():
    model = experts(lora=2)
    inputs = split_batch([900.0, 100.0, 875.0, 874.5])  # high, low, high (at the boundary), low
    out = call(model, inputs)
    out.square().mean().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    reference = []
    for i, t in enumerate(inputs["timestep"].tolist()):  # one sample at a time through its own expert
        expert = model.transformer if t >= BOUNDARY else model.transformer_2
        reference.append(call(expert, batch_slice(inputs, i, i + 1)))
    torch.stack([r[0] for r in reference]).square().mean().backward()
    torch.testing.assert_close(out, torch.cat(reference), rtol=1e-6, atol=1e-6)
    for n, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(got[n], p.grad, rtol=1e-5, atol=1e-7, msg=n)
    assert any(got[n].abs().sum() > 0 for n in got if n.startswith("transformer_2."))


def test_an_expert_without_samples_gets_zero_gradients_not_none():
    model = experts(lora=2)
    call(model, split_batch([999.0, 950.0])).square().mean().backward()
    low = {n: p.grad for n, p in model.named_parameters() if p.requires_grad and n.startswith("transformer_2.")}
    assert low and all(g is not None and not g.any() for g in low.values())


def test_lora_and_parallelize_treat_each_expert_as_a_model():
    model = NoiseExperts(build(FAMILY, seed=0), build(FAMILY, seed=3), boundary=BOUNDARY)
    report = parallelize(model, lora_rank=2, lora_alpha=4.0, selective_ratio=0.5)
    single = parallelize(build(FAMILY), lora_rank=2, lora_alpha=4.0, selective_ratio=0.5)
    assert report.count("lora") == 2 * single.count("lora") > 0
    assert report.count("activation_checkpointing") == 2 * single.count("activation_checkpointing") > 0
    assert {r.swapped.split(":")[0] for r in report.rows} == {"transformer", "transformer_2"}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert {n.split(".")[0] for n in trainable} == {"transformer", "transformer_2"}


@pytest.mark.parametrize("method", ["uniform", "logit-normal"])
@pytest.mark.parametrize("expert", ["high_noise", "low_noise"])
def test_one_expert_trains_on_its_own_noise_range(method, expert):
    lo, hi = expert_time_range(expert, 0.875)
    ranged = RectifiedFlow(sample_method=method, shift=12.0, time_range=(lo, hi))
    t = ranged.sample_time(20000, generator=torch.Generator().manual_seed(0))
    assert ((t >= lo) & (t < hi) | (t == hi)).all()
    # the reference: the plain draw, kept where it falls in the range (rejection sampling)
    plain = RectifiedFlow(sample_method=method, shift=12.0).sample_time(400000, generator=torch.Generator()
                                                                        .manual_seed(1))
    kept = plain[(plain >= lo) & (plain < hi)]
    q = torch.tensor([0.1, 0.5, 0.9])
    torch.testing.assert_close(torch.quantile(t, q), torch.quantile(kept, q), rtol=0, atol=5e-3)


def _distributed_experts(rank, world_size):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    # DDP without find_unused_parameters: rank 0's samples are all high-noise, rank 1's all low-noise.
    serial, model = experts(lora=2), experts(lora=2)
    ddp = DistributedDataParallel(model)
    batch = split_batch([950.0, 900.0, 300.0, 100.0])
    mine = batch_slice(batch, 2 * rank, 2 * rank + 2)
    for _ in range(2):  # a second backward: DDP would hang or raise had a bucket never been reduced
        ddp.zero_grad()
        call(ddp, mine).square().mean().backward()
    call(serial, batch).square().mean().backward()
    worst = max((p.grad - q.grad).abs().max().item() for (n, p), (_, q) in
                zip(model.named_parameters(), serial.named_parameters()) if p.requires_grad)
    # Ulysses over the 2 ranks (both hold the whole batch): the split batch gives the serial outputs.
    sp = experts(lora=2, sp_group=dist.group.WORLD)
    with torch.no_grad():
        sp_diff = (call(sp, batch) - call(experts(lora=2), batch)).abs().max().item()
    return worst, sp_diff


@pytest.mark.slow  # two spawned ranks: ~20-40 s on 2 busy cores
def test_ddp_and_sequence_parallelism_over_a_batch_split_between_experts():
    from tests.distributed import run_distributed

    for worst, sp_diff in run_distributed(_distributed_experts, world_size=2):
        assert worst < 1e-6 and sp_diff < 1e-5, (worst, sp_diff)
