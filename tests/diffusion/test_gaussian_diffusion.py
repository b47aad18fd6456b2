"""Forward process, posterior and training losses against formulas written out here."""

import math

import pytest
import torch
import torch.nn as nn

from opendit_lite.diffusion import (
    GaussianDiffusion,
    LossType,
    ModelMeanType,
    ModelVarType,
    create_diffusion,
    get_named_beta_schedule,
)


def make_diffusion(steps=1000, var_type=ModelVarType.LEARNED_RANGE, loss_type=LossType.MSE,
                   mean_type=ModelMeanType.EPSILON):
    return GaussianDiffusion(
        betas=get_named_beta_schedule("linear", steps),
        model_mean_type=mean_type,
        model_var_type=var_type,
        loss_type=loss_type,
    )


class TinyModel(nn.Module):
    """A 3x3 conv with 2C outputs (prediction, variance values) that also looks at t."""

    def __init__(self, channels=3, out_channels=6):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(channels, out_channels, 3, padding=1)

    def forward(self, x, t, scale=1.0):
        return scale * self.conv(x) + (t.float() / 1000).view(-1, 1, 1, 1)


def true_eps(diffusion, x0):
    """Oracle: the noise that turns x0 into x_t, read off x_t (a perfect denoiser for one data point)."""
    ac = diffusion.alphas_cumprod

    def model(x_t, t):
        a = ac[t].float().view(-1, *([1] * (x_t.dim() - 1)))
        return (x_t - a.sqrt() * x0) / (1 - a).sqrt()

    return model


def test_q_sample_statistics():
    diffusion = make_diffusion()
    torch.manual_seed(0)
    x0 = torch.full((40000, 1), 0.5)
    t = torch.full((40000,), 500, dtype=torch.long)
    x_t = diffusion.q_sample(x0, t)
    abar = diffusion.alphas_cumprod[500].item()
    assert x_t.mean().item() == pytest.approx(math.sqrt(abar) * 0.5, abs=0.02)
    assert x_t.std().item() == pytest.approx(math.sqrt(1 - abar), abs=0.02)
    mean, var, log_var = diffusion.q_mean_variance(x0[:2], t[:2])
    assert torch.allclose(mean, torch.full((2, 1), math.sqrt(abar) * 0.5))
    assert torch.allclose(var, torch.full((2, 1), 1 - abar)) and torch.allclose(log_var, var.log())


def test_q_sample_with_given_noise_is_the_closed_form():
    diffusion = make_diffusion()
    g = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g)
    t = torch.tensor([0, 321, 999])
    abar = diffusion.alphas_cumprod[t].float().view(3, 1, 1, 1)
    expected = abar.sqrt() * x0 + (1 - abar).sqrt() * noise
    assert torch.allclose(diffusion.q_sample(x0, t, noise), expected, atol=1e-5)


def test_posterior_matches_gaussian_conditioning():
    # q(x_{t-1} | x_t, x_0) from the product of N(x_{t-1}; sqrt(abar_{t-1}) x0, 1 - abar_{t-1}) and
    # N(x_t; sqrt(alpha_t) x_{t-1}, beta_t), computed here in float64 without the module's tables.
    diffusion = make_diffusion()
    betas = get_named_beta_schedule("linear", 1000)
    abar = torch.cumprod(1 - betas, 0)
    g = torch.Generator().manual_seed(2)
    x0, x_t = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    t = torch.tensor([1, 10, 500, 999])
    mean, var, log_var = diffusion.q_posterior_mean_variance(x0, x_t, t)
    for i, step in enumerate(t.tolist()):
        beta, prev = betas[step], abar[step - 1]
        precision = 1 / (1 - prev) + (1 - beta) / beta
        exp_var = 1 / precision
        exp_mean = exp_var * (prev.sqrt() * x0[i].double() / (1 - prev) + (1 - beta).sqrt() * x_t[i].double() / beta)
        assert torch.allclose(mean[i].double(), exp_mean, atol=1e-5)
        assert var[i].item() == pytest.approx(exp_var.item(), rel=1e-5)
        assert log_var[i].item() == pytest.approx(math.log(exp_var.item()), rel=1e-5)
    # at t = 0 the posterior is a point mass at x0; its log-variance is clipped to that of t = 1
    mean0, var0, log_var0 = diffusion.q_posterior_mean_variance(x0, x_t, torch.zeros(4, dtype=torch.long))
    assert torch.allclose(mean0, x0, atol=1e-6) and var0.abs().max().item() == 0.0
    assert log_var0[0].item() == pytest.approx(math.log(diffusion.posterior_variance[1].item()), rel=1e-5)


def test_training_losses_shapes_and_hybrid_sum():
    diffusion = create_diffusion("")  # DiT's training diffusion
    model = TinyModel()
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(4, 3, 8, 8, generator=g).clamp(-1, 1)
    t = torch.tensor([0, 1, 500, 999])
    terms = diffusion.training_losses(model, x0, t, model_kwargs=dict(scale=0.5))
    assert set(terms) == {"loss", "mse", "vb"}
    for value in terms.values():
        assert value.shape == (4,) and bool(torch.isfinite(value).all())
    assert torch.allclose(terms["loss"], terms["mse"] + terms["vb"])
    terms["loss"].mean().backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def test_vb_trains_only_the_variance_and_mse_only_the_prediction():
    diffusion = make_diffusion()
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(2, 3, 4, 4, generator=g)
    output = torch.randn(2, 6, 4, 4, generator=g).requires_grad_()
    t = torch.tensor([3, 700])
    terms = diffusion.training_losses(lambda x, t: output, x0, t)
    (vb_grad,) = torch.autograd.grad(terms["vb"].sum(), output, retain_graph=True)
    assert vb_grad[:, :3].abs().max().item() == 0.0 and vb_grad[:, 3:].abs().max().item() > 0
    (mse_grad,) = torch.autograd.grad(terms["mse"].sum(), output)
    assert mse_grad[:, 3:].abs().max().item() == 0.0 and mse_grad[:, :3].abs().max().item() > 0


def test_vb_term_against_closed_form_kl_and_decoder_nll():
    # A perfect epsilon gives the true posterior mean, so the KL is the variance mismatch only; with
    # v = 0 the model's log-variance is halfway between log beta_tilde_t and log beta_t.
    diffusion = make_diffusion()
    g = torch.Generator().manual_seed(5)
    x0 = (torch.randint(0, 256, (2, 3, 4, 4), generator=g).float() / 127.5 - 1)  # 8-bit data
    noise = torch.randn(x0.shape, generator=g)
    oracle = true_eps(diffusion, x0)

    def model(x_t, t):
        return torch.cat([oracle(x_t, t), torch.zeros_like(x_t)], dim=1)

    t = torch.tensor([0, 2])  # early steps, where beta_t and beta_tilde_t differ most
    vb = diffusion.training_losses(model, x0, t, noise=noise)["vb"]

    beta, beta_tilde = diffusion.betas[2].item(), diffusion.posterior_variance[2].item()
    lv_true, lv_model = math.log(beta_tilde), 0.5 * (math.log(beta) + math.log(beta_tilde))
    kl_nats = 0.5 * (lv_model - lv_true + math.exp(lv_true - lv_model) - 1)
    assert vb[1].item() == pytest.approx(kl_nats / math.log(2), rel=1e-3)

    # t = 0: -log2 of the Gaussian mass of each 8-bit bin around the (exact) mean x0
    log_var0 = 0.5 * (math.log(diffusion.betas[0].item()) + math.log(diffusion.posterior_variance[1].item()))
    std0 = math.exp(0.5 * log_var0)

    def cdf(v):
        return 0.5 * (1 + math.erf(v / math.sqrt(2)))

    def bin_mass(value):
        upper = 1.0 if value > 0.999 else cdf((1 / 255) / std0)
        lower = 0.0 if value < -0.999 else cdf((-1 / 255) / std0)
        return upper - lower

    nll_bits = sum(-math.log2(bin_mass(v)) for v in x0[0].flatten().tolist()) / x0[0].numel()
    assert vb[0].item() == pytest.approx(nll_bits, rel=1e-3)


def test_rescaled_mse_scales_vb_by_steps_over_1000():
    g = torch.Generator().manual_seed(6)
    x0, noise = torch.randn(3, 3, 4, 4, generator=g), torch.randn(3, 3, 4, 4, generator=g)
    t = torch.tensor([0, 20, 99])
    model = TinyModel()
    plain = make_diffusion(100).training_losses(model, x0, t, noise=noise)
    rescaled = make_diffusion(100, loss_type=LossType.RESCALED_MSE).training_losses(model, x0, t, noise=noise)
    assert torch.allclose(rescaled["vb"], plain["vb"] * 0.1)
    assert torch.allclose(rescaled["mse"], plain["mse"])
    # DiT's default (1000 steps, MSE) does not rescale, and neither does RESCALED_MSE at 1000 steps
    dit = create_diffusion("").training_losses(model, x0, t, noise=noise)
    rescaled_1000 = create_diffusion("", rescale_learned_sigmas=True).training_losses(model, x0, t, noise=noise)
    assert torch.allclose(dit["vb"], rescaled_1000["vb"])


def test_kl_losses_are_the_bound_term():
    g = torch.Generator().manual_seed(7)
    x0, noise = torch.randn(3, 3, 4, 4, generator=g), torch.randn(3, 3, 4, 4, generator=g)
    t = torch.tensor([0, 40, 99])
    model = TinyModel()
    kl = make_diffusion(100, loss_type=LossType.KL).training_losses(model, x0, t, noise=noise)
    rescaled = make_diffusion(100, loss_type=LossType.RESCALED_KL).training_losses(model, x0, t, noise=noise)
    mse = make_diffusion(100).training_losses(model, x0, t, noise=noise)
    assert set(kl) == {"loss", "vb"} and torch.equal(kl["loss"], kl["vb"])
    assert torch.allclose(kl["vb"], mse["vb"])  # same bound term, but here it trains the mean too
    assert torch.allclose(rescaled["loss"], kl["loss"] * 100)


def test_fixed_variance_has_zero_vb_and_start_x_targets_x0():
    g = torch.Generator().manual_seed(8)
    x0 = torch.randn(2, 3, 4, 4, generator=g)
    t = torch.tensor([5, 50])
    fixed = make_diffusion(100, var_type=ModelVarType.FIXED_LARGE)
    terms = fixed.training_losses(TinyModel(out_channels=3), x0, t)
    assert torch.equal(terms["vb"], torch.zeros(2)) and torch.equal(terms["loss"], terms["mse"])
    start_x = make_diffusion(100, var_type=ModelVarType.FIXED_SMALL, mean_type=ModelMeanType.START_X)
    assert start_x.training_losses(lambda x, t: x0, x0, t)["mse"].abs().max().item() == 0.0


def test_p_mean_variance_learned_range_interpolates_log_variances():
    diffusion = make_diffusion()
    x = torch.zeros(3, 1, 2, 2)
    t = torch.tensor([10, 10, 10])
    v = torch.tensor([-1.0, 0.0, 1.0]).view(3, 1, 1, 1).expand(3, 1, 2, 2)
    out = diffusion.p_mean_variance(lambda x, t: torch.cat([torch.zeros_like(x), v], 1), x, t)
    low, high = math.log(diffusion.posterior_variance[10].item()), math.log(diffusion.betas[10].item())
    expected = torch.tensor([low, (low + high) / 2, high]).view(3, 1, 1, 1).expand(3, 1, 2, 2)
    assert torch.allclose(out["log_variance"], expected, atol=1e-5)
    assert torch.allclose(out["variance"], expected.exp(), rtol=1e-5)


def test_fixed_variances():
    x, t = torch.zeros(2, 1, 2, 2), torch.tensor([0, 10])
    large = make_diffusion(var_type=ModelVarType.FIXED_LARGE).p_mean_variance(lambda x, t: x, x, t)
    small = make_diffusion(var_type=ModelVarType.FIXED_SMALL).p_mean_variance(lambda x, t: x, x, t)
    d = make_diffusion()
    # beta_t, except at t = 0 where beta_tilde_1 replaces the (too small) beta_0
    assert large["variance"].flatten().tolist() == pytest.approx(
        [d.posterior_variance[1].item(), d.betas[10].item()], rel=1e-5
    )
    assert small["variance"].flatten().tolist() == pytest.approx(
        [d.posterior_variance[1].item(), d.posterior_variance[10].item()], rel=1e-5
    )


def test_wrong_output_channels_raise_a_clear_error():
    diffusion = make_diffusion()
    with pytest.raises(ValueError, match="2 x 3 channels"):
        diffusion.training_losses(lambda x, t: x, torch.zeros(2, 3, 4, 4), torch.tensor([1, 2]))
