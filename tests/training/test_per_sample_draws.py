"""Per-sample training draws: a sample's noise, time and condition dropout come from its own stream
seeded by (seed, dataset index, step), so how samples are split over ranks or micro-batches does
not change them (what makes 2 nodes x 2 ranks equal one process, tests/scripts/test_multinode.py)."""

import torch

from opendit_lite.data.indexed import IndexedDataset
from opendit_lite.diffusion import build_scheduler
from opendit_lite.diffusion.loss import objective_loss
from opendit_lite.diffusion.sampling_utils import SampleGenerators, sample_seed
from opendit_lite.models import build_model
from opendit_lite.models.capabilities import condition_dropout_kwarg


def tiny_dit():
    torch.manual_seed(0)
    return build_model("DiT-T/2", input_size=(8, 8), in_channels=3, num_classes=4, learn_sigma=False,
                       class_dropout_prob=0.1).eval()


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 8, 8, generator=g), torch.tensor([0, 1, 2, 3])


def test_rflow_draws_match_a_reference_and_do_not_depend_on_the_split():
    model, (x, y) = tiny_dit(), batch()
    rf = build_scheduler("rflow", num_timesteps=1000, sample_method="logit-normal")
    indices, step = [11, 3, 7, 20], 5
    whole = objective_loss(rf, model, x, dict(y=y), SampleGenerators(0, indices, stream=(step,)))
    halves = [objective_loss(rf, model, x[i:i + 2], dict(y=y[i:i + 2]),
                             SampleGenerators(0, indices[i:i + 2], stream=(step,))) for i in (0, 2)]
    torch.testing.assert_close(whole, sum(halves) / 2, rtol=1e-6, atol=0)
    # the reference: per sample, its noise then a standard normal for the logit-normal time
    losses = []
    for row, index in enumerate(indices):
        g = torch.Generator().manual_seed(sample_seed(0, index, step))
        noise = torch.randn(3, 8, 8, generator=g)
        t = torch.sigmoid(torch.randn((), generator=g))
        x_t = (1 - t) * x[row] + t * noise
        v = model(x_t[None], (t * 1000)[None], y[row:row + 1])[0, :3]
        losses.append(((v - (noise - x[row])) ** 2).mean())
    torch.testing.assert_close(whole, torch.stack(losses).mean(), rtol=1e-5, atol=1e-7)


def test_iddpm_timesteps_are_per_sample_uniform_integers():
    model, (x, y) = tiny_dit(), batch()
    diffusion = build_scheduler("iddpm", noise_schedule="linear", learn_sigma=False, diffusion_steps=1000)
    gens = SampleGenerators(0, [0, 1, 2, 3], stream=(0,))
    whole = objective_loss(diffusion, model, x, dict(y=y), gens)
    losses = []
    for row in range(4):
        g = torch.Generator().manual_seed(sample_seed(0, row, 0))
        noise = torch.randn(3, 8, 8, generator=g)
        t = torch.tensor([int(torch.rand((), generator=g, dtype=torch.float64) * 1000)])
        losses.append(diffusion.training_losses(model, x[row:row + 1], t, dict(y=y[row:row + 1]),
                                                noise=noise[None])["loss"])
    torch.testing.assert_close(whole, torch.cat(losses).mean(), rtol=1e-5, atol=1e-7)


def test_dit_takes_the_trainers_condition_dropout():
    model, (x, y) = tiny_dit(), batch()
    assert condition_dropout_kwarg(model) == "force_drop_ids"
    t = torch.full((4,), 500.0)
    drop = torch.tensor([True, False, True, False])
    null = torch.where(drop, torch.full_like(y, 4), y)
    model.train()  # forced drops replace the random ones
    torch.testing.assert_close(model(x, t, y, force_drop_ids=drop), model(x, t, null))


def test_indexed_dataset_pairs_samples_with_their_index():
    data = IndexedDataset([torch.tensor([k]) for k in range(5)])
    assert len(data) == 5
    key, item = data[3]
    assert key == 3 and item.item() == 3
    bucketed = IndexedDataset(type("D", (), {"__len__": lambda s: 2, "__getitem__": lambda s, i: i})())
    assert bucketed[(1, 4, 16, 16)] == (1, (1, 4, 16, 16))  # a bucket index keys by its sample
