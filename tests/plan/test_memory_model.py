"""The planner's memory model against what autograd really keeps, and its recommendation against
a memory cap on CPU.

Activations are measured exactly: every tensor autograd saves for backward passes through
``saved_tensors_hooks``; distinct storages other than the parameters are summed."""

import pytest
import torch

from opendit_lite.models import build_model
from opendit_lite.plan.memory_model import ModelShape, activation_bytes, model_state_bytes
from opendit_lite.plan.planner import LatentBucket, Setting, plan


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
