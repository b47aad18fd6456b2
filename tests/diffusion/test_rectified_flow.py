import pytest
import torch

from opendit_lite.diffusion import RectifiedFlow

SHAPE = (3, 2, 4, 4)


def exact_velocity(x0, num_timesteps=1000):
    """dx_t/dt of the straight path to the single data point x0: (x_t - x0) / t."""

    def model(x_t, t):
        return (x_t - x0) / (t / num_timesteps).view(-1, 1, 1, 1)

    return model


def test_sampled_times():
    torch.manual_seed(0)
    uniform = RectifiedFlow().sample_time(20000)
    assert uniform.shape == (20000,) and 0 <= uniform.min() and uniform.max() < 1
    assert uniform.mean().item() == pytest.approx(0.5, abs=0.01)
    logit = RectifiedFlow(sample_method="logit-normal").sample_time(20000)
    assert 0 < logit.min().item() and logit.max().item() < 1
    assert logit.mean().item() == pytest.approx(0.5, abs=0.01)
    assert logit.std().item() < uniform.std().item()  # concentrated on the middle times
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(RectifiedFlow().sample_time(5, generator=g1), RectifiedFlow().sample_time(5, generator=g2))


def test_shift_keeps_the_ends_and_moves_towards_noise():
    t = torch.linspace(0, 1, 11)
    assert torch.equal(RectifiedFlow(shift=1.0).shift_time(t), t)
    shifted = RectifiedFlow(shift=3.0).shift_time(t)
    assert shifted[0].item() == 0 and shifted[-1].item() == pytest.approx(1.0)
    assert bool((shifted[1:-1] > t[1:-1]).all())
    assert shifted[5].item() == pytest.approx(3 * 0.5 / (1 + 2 * 0.5))


def test_add_noise_interpolates_data_to_noise():
    rf = RectifiedFlow()
    x0, noise = torch.ones(3, 2), torch.zeros(3, 2)
    x_t = rf.add_noise(x0, noise, torch.tensor([0.0, 0.25, 1.0]))
    assert x_t[:, 0].tolist() == [1.0, 0.75, 0.0]


def test_training_loss_shape_target_and_model_time():
    rf = RectifiedFlow(num_timesteps=1000)
    g = torch.Generator().manual_seed(2)
    x0, noise = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    t = torch.tensor([0.1, 0.5, 0.9])
    seen = []

    def oracle(x_t, model_t):  # knows the noise: predicts v = noise - x0 exactly
        seen.append(model_t)
        return noise - x0

    terms = rf.training_losses(oracle, x0, noise=noise, t=t)
    assert set(terms) == {"loss"} and terms["loss"].shape == (3,)
    assert terms["loss"].abs().max().item() == 0.0
    assert torch.allclose(seen[0], torch.tensor([100.0, 500.0, 900.0]))

    zero = rf.training_losses(lambda x, t: torch.zeros_like(x), x0, noise=noise, t=t)["loss"]
    assert torch.allclose(zero, ((noise - x0) ** 2).mean(dim=(1, 2, 3)))
    sampled = rf.training_losses(lambda x, t: torch.zeros_like(x), x0)["loss"]  # t and noise drawn
    assert sampled.shape == (3,) and bool(torch.isfinite(sampled).all())


def test_learned_sigma_outputs_use_the_first_channels():
    rf = RectifiedFlow()
    g = torch.Generator().manual_seed(3)
    x0, noise, t = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g), torch.rand(3, generator=g)

    def model(x, t):
        return 0.5 * x

    def model_with_sigma(x, t):
        return torch.cat([0.5 * x, torch.full_like(x, 7.0)], dim=1)

    plain = rf.training_losses(model, x0, noise=noise, t=t)["loss"]
    assert torch.equal(rf.training_losses(model_with_sigma, x0, noise=noise, t=t)["loss"], plain)
    sampled = rf.sample(model, noise=noise, num_steps=4)
    assert torch.equal(rf.sample(model_with_sigma, noise=noise, num_steps=4), sampled)


@pytest.mark.parametrize("num_steps,shift", [(1, 1.0), (5, 1.0), (8, 3.0)])
def test_euler_sampler_recovers_a_single_data_point(num_steps, shift):
    # Along a straight path the exact velocity is constant, so Euler steps are exact at any step count.
    x0 = torch.randn(SHAPE, generator=torch.Generator().manual_seed(4))
    rf = RectifiedFlow(shift=shift)
    out = rf.sample(exact_velocity(x0), SHAPE, num_steps=num_steps, generator=torch.Generator().manual_seed(5))
    assert out.shape == SHAPE and (out - x0).abs().max().item() < 1e-4


def test_sampler_starts_at_model_time_num_timesteps_and_is_deterministic():
    rf = RectifiedFlow(num_timesteps=1000)
    seen = []

    def model(x, t):
        seen.append(t[0].item())
        return 0.1 * x

    a = rf.sample(model, SHAPE, num_steps=4, generator=torch.Generator().manual_seed(6))
    b = rf.sample(model, SHAPE, num_steps=4, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and seen == [1000.0, 750.0, 500.0, 250.0] * 2


def test_cfg_scale_guides_the_velocity():
    rf = RectifiedFlow()

    def model(x, t, y):
        return torch.zeros_like(x) + y.view(-1, 1, 1, 1)  # velocity 1 if conditional, 0 otherwise

    z = torch.zeros(2, 1, 2, 2)
    y = torch.tensor([1.0, 0.0])
    out = rf.sample(model, noise=z, model_kwargs=dict(y=y), num_steps=2, cfg_scale=3.0)
    # guided velocity 0 + 3 * (1 - 0) = 3, integrated from t = 1 to 0: x = 0 - 3
    assert torch.allclose(out, torch.full_like(out, -3.0))


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="logit-normal"):
        RectifiedFlow(sample_method="beta")
    with pytest.raises(ValueError, match="shift must be positive"):
        RectifiedFlow(shift=0.0)
    rf = RectifiedFlow()
    with pytest.raises(ValueError, match="at least 2 channels"):
        rf.training_losses(lambda x, t: x[:, :1], torch.zeros(SHAPE))
    with pytest.raises(ValueError, match=r"t must have shape \[B\]"):
        rf.training_losses(lambda x, t: x, torch.zeros(SHAPE), t=torch.zeros(3, 1))
