import math

import torch

from opendit_lite.diffusion.likelihood import (
    approx_standard_normal_cdf,
    discretized_gaussian_log_likelihood,
    mean_flat,
    normal_kl,
)


def test_approx_cdf_is_close_to_the_exact_one():
    x = torch.linspace(-8, 8, 10001, dtype=torch.float64)
    exact = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    assert (approx_standard_normal_cdf(x) - exact).abs().max().item() < 3e-4


def test_normal_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    m1, m2, lv1, lv2 = (torch.randn(5, 7, generator=g, dtype=torch.float64) for _ in range(4))
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(m1, torch.exp(0.5 * lv1)), torch.distributions.Normal(m2, torch.exp(0.5 * lv2))
    )
    assert torch.allclose(normal_kl(m1, lv1, m2, lv2), expected)
    assert torch.allclose(normal_kl(m1, lv1, m1, lv1), torch.zeros_like(m1))


def test_discretized_likelihood_sums_to_one_over_the_256_levels():
    levels = torch.arange(256, dtype=torch.float64) / 127.5 - 1.0  # 8-bit values in [-1, 1]
    for mean, log_scale in ((0.0, math.log(0.1)), (0.7, math.log(0.02)), (-0.95, math.log(0.5))):
        means = torch.full_like(levels, mean)
        log_probs = discretized_gaussian_log_likelihood(levels, means, torch.full_like(levels, log_scale))
        assert abs(log_probs.exp().sum().item() - 1.0) < 1e-9


def test_discretized_likelihood_of_an_interior_bin_matches_the_exact_gaussian_mass():
    x = torch.tensor([0.2], dtype=torch.float64)
    mean, std = torch.tensor([0.21], dtype=torch.float64), 0.05

    def cdf(v):
        return 0.5 * (1 + math.erf(v / math.sqrt(2)))

    exact = cdf((0.2 + 1 / 255 - 0.21) / std) - cdf((0.2 - 1 / 255 - 0.21) / std)
    got = discretized_gaussian_log_likelihood(x, mean, torch.tensor([math.log(std)], dtype=torch.float64))
    assert abs(got.exp().item() - exact) < 5e-4


def test_mean_flat_keeps_the_batch_axis():
    x = torch.arange(24.0).view(2, 3, 4)
    assert torch.equal(mean_flat(x), torch.tensor([5.5, 17.5]))
