"""The planner's memory model against what autograd really keeps, and its recommendation against
a memory cap on CPU.

Activations are measured exactly: every tensor autograd saves for backward passes through
``saved_tensors_hooks``; distinct storages other than the parameters are summed."""

import pytest
import torch

from opendit_lite.models import build_model
from opendit_lite.plan.memory_model import (
    GiB,
    ModelShape,
    activation_bytes,
    model_state_bytes,
    offloaded_activation_bytes,
    sample_tokens,
)
from opendit_lite.plan.planner import HostBudget, LatentBucket, Setting, plan


def saved_activation_bytes(model, run) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run()
    return sum(seen.values()), loss


def _video_step(model, B, T, H, W, M=8):
    x = torch.randn(B, 4, T, H, W)
    y = torch.randn(B, M, 32)
    mask = torch.ones(B, M, dtype=torch.bool)
    return lambda: model(x, torch.rand(B) * 999, y, mask).square().mean()


# Widths, depths and shapes other than those the per-block widths were counted at.
CASES = [
    ("STDiT-tiny", dict(depth=3, hidden_size=96, num_heads=6), (2, 3, 8, 24)),
    ("STDiT-tiny", dict(depth=2, hidden_size=64, num_heads=4, mlp_ratio=2.0), (1, 1, 32, 16)),
    ("Vchitect-tiny", dict(depth=3, hidden_size=96, num_heads=6), (1, 5, 8, 24)),
    ("DiT-T/2", dict(input_size=(24, 16)), (3, 1, 24, 16)),
]


@pytest.mark.parametrize("name,kwargs,shape", CASES)
def test_predicted_activation_memory_within_15_percent(name, kwargs, shape):
    torch.manual_seed(0)
    model = build_model(name, **kwargs)
    B, T, H, W = shape
    if name.startswith("DiT"):
        x, labels = torch.randn(B, 4, H, W), torch.randint(0, 1000, (B,))

        def run():
            return model(x, torch.rand(B) * 999, labels).square().mean()

        caption = 0
    else:
        run, caption = _video_step(model, B, T, H, W), 8
    measured, _ = saved_activation_bytes(model, run)
    predicted = activation_bytes(ModelShape.of(model), T, H, W, B, element_bytes=4, caption_tokens=caption)
    assert abs(predicted / measured - 1) < 0.15, f"{name} {shape}: predicted {predicted}, measured {measured}"


def test_recommended_batch_runs_within_the_cap():
    """Plan STDiT-tiny for a 12 MiB device (fp32, DDP, one rank), then run one full step at the
    recommended batch: weights, gradients, Adam moments, the EMA and the saved activations fit."""
    torch.manual_seed(0)
    model = build_model("STDiT-tiny", class_dropout_prob=0.0)
    shape = ModelShape.of(model)
    buckets = [LatentBucket("clips", 4, 16, 16), LatentBucket("images", 1, 32, 32)]
    cap_gib = 12 / 1024
    # The planner's default margin (10% of the memory) on top of the model; no fixed reserve on CPU.
    result = plan(shape, buckets, cap_gib, world_size=1, element_bytes=4, caption_tokens=8, reserve_gib=0,
                  settings=[Setting(0, 1, 1.0, False)])
    assert all(b >= 1 for b in result.batches.values())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ema = [p.detach().clone() for p in model.parameters()]
    for bucket in buckets:
        batch = result.batches[bucket.name]
        activations, loss = saved_activation_bytes(model, _video_step(model, batch, bucket.frames, bucket.height,
                                                                      bucket.width))
        loss.backward()
        optimizer.step()
        states = sum(t.numel() * t.element_size() for p in model.parameters()
                     for t in (p, p.grad, *optimizer.state[p].values()) if t is not None and t.dim() > 0)
        states += sum(e.numel() * e.element_size() for e in ema)
        # The formula counts every parameter; the unused null caption has no gradient or moments here.
        assert 0.97 < states / (model_state_bytes(0, shape.params, 1) + 4 * shape.params) <= 1
        assert states + activations <= cap_gib * 2 ** 30, f"{bucket.name}: batch {batch} exceeds the cap"
        # ... and the recommendation is tight: one more sample would not have fit by the model.
        more = activation_bytes(shape, bucket.frames, bucket.height, bucket.width, batch + 1, 4, caption_tokens=8)
        assert states + more > result.usable_gib * 2 ** 30 or batch == 256
        optimizer.zero_grad()


def test_planner_turns_on_checkpointing_then_sequence_parallelism_as_memory_shrinks():
    shape = ModelShape.of(build_model("STDiT-tiny"))
    bucket = [LatentBucket("long", 64, 64, 64)]
    roomy = plan(shape, bucket, 8, world_size=4, element_bytes=4, reserve_gib=0)
    tight = plan(shape, bucket, 1, world_size=4, element_bytes=4, reserve_gib=0)
    assert roomy.setting == Setting(2, 1, 1.0, False)
    assert tight.setting.cost() > roomy.setting.cost()
    assert tight.setting.sp_size > 1 or tight.setting.selective_ratio < 1
    with pytest.raises(ValueError, match="no setting fits"):
        plan(shape, bucket, 0.01, world_size=4, element_bytes=4, reserve_gib=0)


def test_host_memory_caps_the_offloaded_batch_and_refuses_a_setting_it_cannot_hold():
    shape = ModelShape.of(build_model("STDiT-tiny"))
    bucket = [LatentBucket("clips", 8, 32, 32)]
    offload = Setting(0, 1, 0.0, True)  # every block checkpointed, its input in host memory
    per_sample = offloaded_activation_bytes(shape, 8, 32, 32, 1, 4, 1, 0.0, True)
    assert per_sample == shape.depth * sample_tokens(shape, 8, 32, 32) * shape.hidden_size * 4  # one input per block
    assert activation_bytes(shape, 8, 32, 32, 1, 4, 1, 0.0, False) - activation_bytes(
        shape, 8, 32, 32, 1, 4, 1, 0.0, True) == pytest.approx(per_sample)  # what leaves the device lands there
    arguments = dict(element_bytes=4, reserve_gib=0, settings=[offload])
    free = plan(shape, bucket, 8, 1, **arguments)
    assert free.batches["clips"] > 3 and free.host_gib is None
    # Two ranks share the node's host: room for 3.5 samples each holds 3.
    two = HostBudget(7 * per_sample / GiB, 2, lambda s: 0.0, lambda s, b: per_sample)
    capped = plan(shape, bucket, 8, 1, **arguments, host=two)
    assert capped.batches["clips"] == 3 and capped.host_gib == pytest.approx(6 * per_sample / GiB)
    # A fixed part (swapped blocks, offloaded optimizer states) the host cannot hold: refused, and said so.
    small = HostBudget(1.0, 1, lambda s: 2.0 * GiB, lambda s, b: 0.0)
    with pytest.raises(ValueError, match="1 setting.s. that fit the device need more than the 1.0 GiB of host"):
        plan(shape, bucket, 8, 1, **arguments, host=small)
    # A setting that puts nothing on the host is never refused for it, however small the host.
    nothing = HostBudget(-4.0, 8, lambda s: 0.0, lambda s, b: 0.0)
    plain = dict(arguments, settings=[Setting(0, 1, 1.0, False)])
    assert plan(shape, bucket, 8, 1, **plain, host=nothing).batches == plan(shape, bucket, 8, 1, **plain).batches
