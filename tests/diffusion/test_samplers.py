"""DDPM and DDIM sampling loops: shapes, determinism, perfect-denoiser recovery, diffusers parity."""

import pytest
import torch

from opendit_lite.diffusion import cfg_model_fn, create_diffusion, get_named_beta_schedule

SHAPE = (2, 3, 4, 4)


def oracle_eps(x0, steps=1000):
    """Predicts the exact noise of x_t w.r.t. the single data point x0 (plus a zero variance block).

    It reads the *original* timestep, so respaced samplers only recover x0 if they map timesteps back.
    """
    alphas_cumprod = torch.cumprod(1 - get_named_beta_schedule("linear", steps), 0)

    def model(x_t, t):
        a = alphas_cumprod[t].float().view(-1, 1, 1, 1)
        eps = (x_t - a.sqrt() * x0) / (1 - a).sqrt()
        return torch.cat([eps, torch.zeros_like(eps)], dim=1)

    return model


def smooth_model(x, t):
    """A deterministic stand-in network: a smooth function of (x, t) with learned-range variance values."""
    phase = (t.float() / 1000).view(-1, 1, 1, 1)
    return torch.cat([0.3 * x * torch.cos(3 * phase) + 0.1 * phase, torch.tanh(x) * 0.5], dim=1)


@pytest.mark.parametrize("loop", ["p_sample_loop", "ddim_sample_loop"])
def test_loops_return_the_shape_and_are_deterministic(loop):
    diffusion = create_diffusion("ddim20")
    run = getattr(diffusion, loop)
    kwargs = dict(eta=1.0) if loop == "ddim_sample_loop" else {}  # make both stochastic
    a = run(smooth_model, SHAPE, generator=torch.Generator().manual_seed(0), **kwargs)
    b = run(smooth_model, SHAPE, generator=torch.Generator().manual_seed(0), **kwargs)
    c = run(smooth_model, SHAPE, generator=torch.Generator().manual_seed(1), **kwargs)
    assert a.shape == SHAPE and bool(torch.isfinite(a).all())
    assert torch.equal(a, b) and not torch.equal(a, c)
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(2))
    d = run(smooth_model, noise=noise, generator=torch.Generator().manual_seed(3), **kwargs)
    e = run(smooth_model, SHAPE, noise.clone(), generator=torch.Generator().manual_seed(3), **kwargs)
    assert torch.equal(d, e)


def test_ddim_eta0_is_deterministic_given_the_noise():
    diffusion = create_diffusion("ddim10")
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(4))
    a = diffusion.ddim_sample_loop(smooth_model, noise=noise, generator=torch.Generator().manual_seed(5))
    b = diffusion.ddim_sample_loop(smooth_model, noise=noise, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b)


@pytest.mark.parametrize("respacing", ["ddim25", "50"])
def test_perfect_denoiser_recovers_the_data_point(respacing):
    x0 = torch.rand(SHAPE, generator=torch.Generator().manual_seed(7)) * 2 - 1
    diffusion = create_diffusion(respacing)
    model = oracle_eps(x0)
    ddim = diffusion.ddim_sample_loop(model, SHAPE, clip_denoised=False, generator=torch.Generator().manual_seed(8))
    assert (ddim - x0).abs().max().item() < 1e-3
    # DDPM too: with the true x0 the last step's mean is x0 itself (and t = 0 adds no noise)
    ddpm = diffusion.p_sample_loop(model, SHAPE, clip_denoised=False, generator=torch.Generator().manual_seed(8))
    assert (ddpm - x0).abs().max().item() < 1e-3


def test_progressive_yields_every_step_and_progress_bar_runs():
    diffusion = create_diffusion("ddim5")
    outs = list(diffusion.p_sample_loop_progressive(smooth_model, SHAPE, progress=True))
    assert len(outs) == 5 and all(set(o) == {"sample", "pred_xstart"} for o in outs)
    assert len(list(diffusion.ddim_sample_loop_progressive(smooth_model, SHAPE))) == 5


def test_loops_need_shape_or_matching_noise():
    diffusion = create_diffusion("ddim5")
    with pytest.raises(ValueError, match="shape"):
        diffusion.p_sample_loop(smooth_model)
    with pytest.raises(ValueError, match="disagrees"):
        diffusion.p_sample_loop(smooth_model, (1, 3, 4, 4), torch.zeros(SHAPE))


def test_guided_sampling_reads_only_the_first_half():
    diffusion = create_diffusion("ddim5")

    def model(x, t, y):
        return smooth_model(x, t) + 0.1 * y.view(-1, 1, 1, 1)

    z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(9))
    y = torch.tensor([1.0, 2.0, 0.0, 0.0])  # labels, then the null label
    guided = cfg_model_fn(model, 4.0)
    runs = [
        diffusion.p_sample_loop(guided, noise=torch.cat([z, second]), model_kwargs=dict(y=y),
                                generator=torch.Generator().manual_seed(10))
        for second in (z, torch.zeros_like(z))
    ]
    assert runs[0].shape == (4, 3, 4, 4)
    assert torch.equal(runs[0][:2], runs[1][:2])


# ---------------------------------------------------------------- parity with diffusers' schedulers


def test_ddim_matches_diffusers_ddim_scheduler():
    diffusers = pytest.importorskip("diffusers")
    scheduler = diffusers.DDIMScheduler(
        num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=2e-2,
        clip_sample=False, set_alpha_to_one=True, steps_offset=0, timestep_spacing="leading",
    )
    scheduler.set_timesteps(25)  # "leading" spacing: 960, 920, ..., 0 == our "ddim25"
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(11))
    expected = x.clone()
    for t in scheduler.timesteps:
        eps = smooth_model(expected, t.view(1).expand(SHAPE[0]))[:, :3]
        expected = scheduler.step(eps, t, expected, eta=0.0).prev_sample
    ours = create_diffusion("ddim25").ddim_sample_loop(smooth_model, noise=x, clip_denoised=False)
    # diffusers keeps its schedule in float32, hence a relative tolerance (values grow large here)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("step", [0, 1, 500, 999])
def test_ddpm_step_matches_diffusers_learned_range(step):
    diffusers = pytest.importorskip("diffusers")
    scheduler = diffusers.DDPMScheduler(
        num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=2e-2,
        variance_type="learned_range", clip_sample=False,
    )
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(12))
    t = torch.full((SHAPE[0],), step)
    expected = scheduler.step(smooth_model(x, t), step, x, generator=torch.Generator().manual_seed(13)).prev_sample
    ours = create_diffusion("").p_sample(smooth_model, x, t, clip_denoised=False,
                                         generator=torch.Generator().manual_seed(13))["sample"]
    # diffusers computes 1 - alpha_bar in float32, which loses ~3e-4 relative precision at t = 1
    torch.testing.assert_close(ours, expected, rtol=1e-3, atol=5e-4)


@pytest.mark.gpu
def test_cuda_matches_cpu_with_a_cpu_generator():
    diffusion = create_diffusion("ddim10")
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(14))
    for loop in (diffusion.p_sample_loop, diffusion.ddim_sample_loop):  # p_sample draws noise every step
        cpu = loop(smooth_model, noise=noise, clip_denoised=False, generator=torch.Generator().manual_seed(15))
        cuda = loop(smooth_model, noise=noise.cuda(), clip_denoised=False,
                    generator=torch.Generator().manual_seed(15))  # a CPU generator drives CUDA sampling
        assert cuda.device.type == "cuda"
        torch.testing.assert_close(cuda.cpu(), cpu, rtol=1e-4, atol=1e-4)
    t = torch.tensor([0, 9])
    losses_cpu = diffusion.training_losses(smooth_model, noise, t, noise=noise)
    losses_cuda = diffusion.training_losses(smooth_model, noise.cuda(), t.cuda(), noise=noise.cuda())
    for key, value in losses_cpu.items():
        torch.testing.assert_close(losses_cuda[key].cpu(), value, rtol=1e-4, atol=1e-5)
