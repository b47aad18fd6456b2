"""DMD2's optional GAN term in distillation (distill.gan_weight): 0 is the loss without it exactly; > 0 adds,
on a critic step, the head's non-saturating loss on the batch's noised images vs the student's noised samples
(the head on the critic's middle block, trained with the critic) and, on a student step, the generator's
non-saturating loss, whose gradient reaches the student only (critic and head get none). References are
written here from the building blocks, one network call each."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from opendit_lite.builders.distill_model import CRITIC, STUDENT, TEACHER, DistillModule, GanHead, add_adapters
from opendit_lite.diffusion import build_scheduler
from opendit_lite.diffusion.distribution_matching import (
    backward_simulate,
    critic_loss,
    generator_loss,
    predict_x0,
    sampler_times,
)
from opendit_lite.diffusion.sampling_utils import SampleGenerators, standard_normal_like
from opendit_lite.training.distill import JUDGE_HIGH, JUDGE_LOW, distill_loss, student_step_index
from tests.training.test_distill import tiny_dit

WEIGHT, N, T = 0.5, 3, 1000


def cfg(gan_weight: float):
    return SimpleNamespace(distill=SimpleNamespace(student_timesteps=2, guidance_scale=3.0, critic_updates=1,
                                                   gan_weight=gan_weight),
                           model=SimpleNamespace(num_classes=4, class_dropout_prob=0.1, name="DiT-T/2"), global_seed=0)


def module(gan: bool) -> DistillModule:
    base = tiny_dit()
    add_adapters(base, (STUDENT, CRITIC), rank=2, alpha=2.0, dropout=0.0, targets=None)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.05)
    torch.manual_seed(3)
    return DistillModule(base, gan_head=GanHead(32) if gan else None)


def inputs():
    g = torch.Generator().manual_seed(5)
    return torch.randn(N, 3, 8, 8, generator=g), torch.tensor([0, 3, 1])


def loss_and_grads(m, gan_weight: float, step: int):
    x, y = inputs()
    loss = distill_loss(m, build_scheduler("rflow", num_timesteps=T), cfg(gan_weight), x, dict(y=y),
                        SampleGenerators(0, list(range(N)), stream=(step,)), step)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    return loss.detach(), grads


def reference(m, step: int):
    """The step's pieces by hand, in distill_loss's draw order: (the loss without the GAN term, the samples
    x0 (with gradient on a student step), the judging times, their noise, the next draw (the real images'
    noise), the clean images and labels)."""
    x, y = inputs()
    keep = dict(force_drop_ids=torch.zeros(N, dtype=torch.bool))
    draws = SampleGenerators(0, list(range(N)), stream=(step,))

    def velocity(role):
        return lambda z, t: m(z, t, role=role, y=y, **keep)

    def teacher(z, t):
        out = m(torch.cat([z, z]), torch.cat([t, t]), role=TEACHER, y=torch.cat([y, torch.full_like(y, 4)]),
                force_drop_ids=torch.zeros(2 * N, dtype=torch.bool))
        cond, uncond = out.chunk(2)
        return uncond + 3.0 * (cond - uncond)

    times = sampler_times(build_scheduler("rflow", num_timesteps=T), 2)
    k = student_step_index(0, step, 2)
    noise = standard_normal_like(x, draws)
    x_k = backward_simulate(velocity(STUDENT), noise, times, k, T)
    t_k = torch.full((N,), times[k])
    judge_noise = standard_normal_like(x, draws)
    judge_t = JUDGE_LOW + (JUDGE_HIGH - JUDGE_LOW) * draws.uniform((N,), x.device, torch.float32)
    if step % 2:
        x0 = predict_x0(velocity(STUDENT), x_k, t_k, T)
        base = generator_loss(x0, teacher, velocity(CRITIC), judge_t, judge_noise, T)
    else:
        with torch.no_grad():
            x0 = predict_x0(velocity(STUDENT), x_k, t_k, T)
        base = critic_loss(x0, velocity(CRITIC), judge_t, judge_noise, T)
    real_noise = standard_normal_like(x, draws)
    return base, x0, judge_t, judge_noise, real_noise, x, y, keep


def test_gan_weight_zero_is_the_loss_without_it():
    m = module(gan=False)
    assert not any(n.startswith("gan_head") for n in m.state_dict())
    for step in (0, 1):
        loss, grads = loss_and_grads(m, 0.0, step)
        base, *_ = reference(m, step)
        base.backward()
        assert torch.equal(loss, base.detach())
        assert all(torch.equal(grads[n], p.grad) for n, p in m.named_parameters() if p.grad is not None)
        assert grads.keys() == {n for n, p in m.named_parameters() if p.grad is not None}
        m.zero_grad(set_to_none=True)


def test_gan_term_on_critic_and_student_steps():
    m = module(gan=True)
    s = lambda t: t.view(-1, 1, 1, 1)  # noqa: E731

    # critic step: flow matching + WEIGHT x the head's loss (real towards 1, fake towards 0); critic and head train
    loss, grads = loss_and_grads(m, WEIGHT, 0)
    base, x0, judge_t, judge_noise, real_noise, x, y, keep = reference(m, 0)
    _, fake = m((1 - s(judge_t)) * x0 + s(judge_t) * judge_noise, judge_t * T, role=CRITIC, features=True, y=y, **keep)
    _, real = m((1 - s(judge_t)) * x + s(judge_t) * real_noise, judge_t * T, role=CRITIC, features=True, y=y, **keep)
    expected = base + WEIGHT * (F.softplus(-real).mean() + F.softplus(fake).mean())
    expected.backward()
    print("critic", (loss - expected).abs().item())
    assert torch.allclose(loss, expected.detach(), rtol=0, atol=1e-6)
    assert grads.keys() == {n for n, p in m.named_parameters() if p.grad is not None}
    assert any(n.startswith("gan_head.") for n in grads) and not any(f".{STUDENT}." in n for n in grads)
    assert max((grads[n] - p.grad).abs().max().item() for n, p in m.named_parameters() if p.grad is not None) < 1e-5
    m.zero_grad(set_to_none=True)

    # student step: DMD + WEIGHT x the generator's loss, whose gradient reaches the student through x0 only
    loss, grads = loss_and_grads(m, WEIGHT, 1)
    assert all(f".{STUDENT}." in n for n in grads) and grads
    base, x0, judge_t, judge_noise, *_ , y, keep = reference(m, 1)
    _, fake = m((1 - s(judge_t)) * x0 + s(judge_t) * judge_noise, judge_t * T, role=CRITIC, features=True, y=y, **keep)
    expected = base + WEIGHT * F.softplus(-fake).mean()
    student = [p for n, p in m.named_parameters() if f".{STUDENT}." in n]
    reference_grads = torch.autograd.grad(expected, student)
    print("student", (loss - expected).abs().item())
    assert torch.allclose(loss, expected.detach(), rtol=0, atol=1e-6)
    names = [n for n, _ in m.named_parameters() if f".{STUDENT}." in n]
    assert max((grads[n] - g).abs().max().item() for n, g in zip(names, reference_grads)) < 1e-5
