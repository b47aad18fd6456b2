"""v-prediction (CogVideoX's objective) against formulas written here, and Flux's / LTX-Video's
resolution-dependent shift against the linear-in-tokens rule."""

import math

import numpy as np
import pytest
import torch

from opendit_lite.diffusion import VPrediction, resolution_shift
from opendit_lite.diffusion.v_prediction import v_prediction_alphas_cumprod


def reference_alphas_cumprod(n, snr_shift):
    """scaled-linear betas -> alpha_bar -> SNR / snr_shift -> zero terminal SNR, step by step in numpy."""
    betas = np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, n) ** 2
    abar = np.cumprod(1.0 - betas)
    snr = abar / (1 - abar) / snr_shift                     # the shift divides the SNR
    abar = snr / (1 + snr)
    s = np.sqrt(abar)
    s = (s - s[-1]) * s[0] / (s[0] - s[-1])                 # last value 0, first unchanged
    return s ** 2


@pytest.mark.parametrize("snr_shift", [1.0, 3.0])
def test_schedule_matches_the_reference_formula(snr_shift):
    got = v_prediction_alphas_cumprod(1000, snr_shift=snr_shift).numpy()
    np.testing.assert_allclose(got, reference_alphas_cumprod(1000, snr_shift), rtol=1e-10, atol=1e-12)
    assert got[-1] == 0 and got[0] > 0.99


def test_schedule_matches_diffusers_cogvideox_scheduler():
    from diffusers import CogVideoXDDIMScheduler

    for shift in (1.0, 3.0):
        ref = CogVideoXDDIMScheduler(snr_shift_scale=shift, rescale_betas_zero_snr=True, beta_schedule="scaled_linear",
                                     beta_start=0.00085, beta_end=0.012)
        torch.testing.assert_close(v_prediction_alphas_cumprod(1000, snr_shift=shift).float(),
                                   ref.alphas_cumprod.float(), rtol=1e-5, atol=1e-6)


def test_loss_is_the_v_mse_and_equals_the_weighted_x0_loss():
    torch.manual_seed(0)
    vp = VPrediction()
    x0, noise = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    t = torch.tensor([0, 500, 998])
    out = torch.randn(3, 2, 4)
    loss = vp.training_losses(lambda x, tt: out, x0, t, noise=noise)["loss"]
    abar = torch.from_numpy(reference_alphas_cumprod(1000, 1.0))[t].float().view(-1, 1, 1)
    v = abar.sqrt() * noise - (1 - abar).sqrt() * x0
    torch.testing.assert_close(loss, ((out - v) ** 2).mean(dim=(1, 2)))
    # CogVideoX's form: x_0 implied by the prediction, error weighted by 1 / (1 - alpha_bar)
    x_t = abar.sqrt() * x0 + (1 - abar).sqrt() * noise
    x0_hat = abar.sqrt() * x_t - (1 - abar).sqrt() * out
    torch.testing.assert_close(loss, (((x0_hat - x0) ** 2) / (1 - abar)).mean(dim=(1, 2)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("steps", [1, 4, 50])
def test_ddim_with_the_true_v_recovers_the_data(steps):
    vp = VPrediction()
    x0 = torch.randn(2, 3, 5)

    def oracle(x, t):
        signal, sigma = vp._coefficients(t, x)
        eps = (x - signal * x0) / sigma
        return signal * eps - sigma * x0

    noise = torch.randn(2, 3, 5)
    torch.testing.assert_close(vp.sample(oracle, noise=noise, num_steps=steps), x0, rtol=1e-4, atol=1e-4)
    assert vp.sampling_timesteps(4) == [999, 749, 499, 249]


def test_resolution_shift_is_linear_in_tokens():
    # mu = m * tokens + b through (256, 0.5) and (4096, 1.15) (Flux's scheduler settings)
    m = (1.15 - 0.5) / (4096 - 256)
    b = 0.5 - m * 256
    for tokens in (256, 1024, 4096, 8192):
        assert resolution_shift(tokens, 256, 4096, 0.5, 1.15) == pytest.approx(math.exp(m * tokens + b))
