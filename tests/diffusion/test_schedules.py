import math

import pytest
import torch

from opendit_lite.diffusion import GaussianDiffusion, LossType, ModelMeanType, ModelVarType, get_named_beta_schedule


def test_linear_schedule_is_dits():
    betas = get_named_beta_schedule("linear", 1000)
    assert betas.dtype == torch.float64 and betas.shape == (1000,)
    assert betas[0].item() == pytest.approx(1e-4, abs=1e-15)
    assert betas[-1].item() == pytest.approx(2e-2, abs=1e-15)
    assert torch.allclose(betas.diff(), torch.full((999,), (2e-2 - 1e-4) / 999, dtype=torch.float64))


def test_linear_schedule_scales_with_step_count():
    betas = get_named_beta_schedule("linear", 100)  # 10x fewer steps -> 10x larger betas
    assert betas[0].item() == pytest.approx(1e-3) and betas[-1].item() == pytest.approx(0.2)


def test_cosine_schedule_follows_its_alpha_bar():
    steps = 1000
    betas = get_named_beta_schedule("cosine", steps)
    assert torch.equal(betas, get_named_beta_schedule("squaredcos_cap_v2", steps))
    assert bool((betas > 0).all()) and betas.max().item() == pytest.approx(0.999)

    def f(s):
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    alphas_cumprod = torch.cumprod(1 - betas, 0)
    for t in (0, 10, 250, 500, 900):  # before the cap at 0.999 kicks in, the product telescopes
        assert alphas_cumprod[t].item() == pytest.approx(f((t + 1) / steps) / f(0), rel=1e-9)


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_alphas_cumprod_decrease_from_one_to_almost_zero(name):
    diffusion = GaussianDiffusion(
        betas=get_named_beta_schedule(name, 1000),
        model_mean_type=ModelMeanType.EPSILON,
        model_var_type=ModelVarType.LEARNED_RANGE,
        loss_type=LossType.MSE,
    )
    ac = diffusion.alphas_cumprod
    assert bool((ac.diff() < 0).all())
    assert 0.99 < ac[0].item() < 1 and ac[-1].item() < 1e-4
    assert diffusion.alphas_cumprod_prev[0].item() == 1.0
    assert torch.equal(diffusion.alphas_cumprod_prev[1:], ac[:-1])


def test_unknown_schedule_names_the_valid_ones():
    with pytest.raises(ValueError, match="'linear'.*'cosine'"):
        get_named_beta_schedule("quadratic", 10)


def test_betas_out_of_range_are_rejected():
    with pytest.raises(ValueError, match=r"betas must lie in \(0, 1\]"):
        GaussianDiffusion(
            betas=get_named_beta_schedule("linear", 4),  # 4 steps: betas up to 5.0
            model_mean_type=ModelMeanType.EPSILON,
            model_var_type=ModelVarType.FIXED_LARGE,
            loss_type=LossType.MSE,
        )
