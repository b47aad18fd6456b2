"""DMD2's pieces for rectified flow against references written here: the student's times are the Euler
sampler's grid (and diffusers' FlowMatchEulerDiscreteScheduler's for the same step count and shift),
backward simulation is the sampler's first k steps, the student's loss has the DMD gradient, zero when
critic and teacher agree, and the critic's loss is flow matching on detached samples."""

import torch

from opendit_lite.diffusion.distribution_matching import (
    backward_simulate,
    critic_loss,
    generator_loss,
    judge_times,
    predict_x0,
    sampler_times,
    scheduler_times,
)
from opendit_lite.diffusion.rectified_flow import RectifiedFlow


def _linear(scale: float):
    """A toy velocity predictor v = scale * x + t / 1000 (model time in [0, 1000])."""
    return lambda x, t: scale * x + (t / 1000).view(-1, *([1] * (x.dim() - 1)))


def test_student_times_are_the_samplers_grid_or_the_pipeline_scheduler_s():
    from diffusers import FlowMatchEulerDiscreteScheduler

    times = sampler_times(RectifiedFlow(shift=3.0), 4)
    assert times == [3 * g / (1 + 2 * g) for g in (1.0, 0.75, 0.5, 0.25, 0.0)]
    # a pipeline's scheduler stepping its transformer N times moves the latents as backward simulation does
    scheduler, student = FlowMatchEulerDiscreteScheduler(shift=3.0), _linear(-0.3)
    grid = scheduler_times(scheduler, 4)
    noise = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    x = noise
    for timestep in scheduler.timesteps:
        x = scheduler.step(student(x, timestep.expand(2)), timestep, x).prev_sample
    assert len(grid) == 5 and grid[-1] == 0.0
    assert torch.allclose(backward_simulate(student, noise, grid, 4, 1000), x, atol=1e-5)


def test_backward_simulation_is_the_samplers_first_steps():
    objective = RectifiedFlow(shift=2.0)
    student = _linear(-0.3)
    noise = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    times = sampler_times(objective, 4)
    full = objective.sample(lambda x, t: student(x, t), noise=noise, num_steps=4)
    x = backward_simulate(student, noise, times, 4, objective.num_timesteps)
    assert torch.allclose(x, full, atol=1e-6)
    x1 = backward_simulate(student, noise, times, 1, objective.num_timesteps)
    assert torch.allclose(x1, noise + (times[1] - times[0]) * student(noise, torch.full((3,), times[0] * 1000)))


def test_the_student_loss_has_the_dmd_gradient_and_none_when_critic_and_teacher_agree():
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(2, 3, 4, generator=g, requires_grad=True)
    noise, t = torch.randn(2, 3, 4, generator=g), torch.tensor([0.3, 0.7])
    teacher, critic = _linear(-0.5), _linear(0.25)
    generator_loss(x0, teacher, critic, t, noise, 1000).backward()
    s = t.view(-1, 1, 1)
    x_t = (1 - s) * x0.detach() + s * noise
    real = x_t - s * teacher(x_t, t * 1000)
    fake = x_t - s * critic(x_t, t * 1000)
    weight = (x0.detach() - real).abs().mean(dim=(1, 2)).view(-1, 1, 1)
    assert torch.allclose(x0.grad, (fake - real) / weight / x0.numel(), atol=1e-7)
    x0.grad = None
    generator_loss(x0, teacher, teacher, t, noise, 1000).backward()
    assert torch.equal(x0.grad, torch.zeros_like(x0))


def test_the_critic_learns_the_flow_of_detached_samples():
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(2, 5, generator=g, requires_grad=True)
    noise, t = torch.randn(2, 5, generator=g), torch.tensor([0.2, 0.9])
    weight = torch.tensor(0.5, requires_grad=True)
    loss = critic_loss(x0 * 1.0, lambda x, tt: weight * x, t, noise, 1000)
    loss.backward()
    x_t = (1 - t.view(-1, 1)) * x0.detach() + t.view(-1, 1) * noise
    assert torch.allclose(loss, ((0.5 * x_t - (noise - x0.detach())) ** 2).mean())
    assert x0.grad is None and weight.grad is not None
    assert torch.allclose(predict_x0(_linear(0.0), x_t, t, 1000), x_t - t.view(-1, 1) ** 2)
    times = judge_times(1000, torch.Generator().manual_seed(0), "cpu")
    assert 0.02 <= times.min() and times.max() <= 0.98
