"""The EMA's decay per update (``opendit_lite.ema.decay``): the warm-up is diffusers' EMAModel's own
rule, ``kept_fraction`` is the EMA of a steady change under that schedule (against the closed form of
a constant decay), the horizon note warns when a LoRA run's EMA would keep under half of it, and
AdamWEMA's in-step EMA follows a decay that changes every step when told one step ahead."""

import pytest
import torch

from opendit_lite.ema import ema_decay, ema_horizon_note, ema_warmup_on, kept_fraction
from opendit_lite.optim import AdamWEMA


@pytest.mark.parametrize("decay", [0.9999, 0.99, 0.5])
def test_the_warm_up_is_diffusers_emamodel_get_decay(decay):
    from diffusers.training_utils import EMAModel

    reference = EMAModel([torch.nn.Parameter(torch.zeros(1))], decay=decay)
    for step in range(300):
        assert ema_decay(decay, step, warmup=True) == pytest.approx(reference.get_decay(step + 1), abs=1e-12)
        assert ema_decay(decay, step, warmup=False) == decay


def test_kept_fraction_of_a_steady_change():
    steps, d = 300, 0.9999
    closed_form = sum((1 - d) * d ** (steps - t) * t / steps for t in range(1, steps + 1))
    assert kept_fraction(d, steps, warmup=False) == pytest.approx(closed_form, rel=1e-9)
    assert kept_fraction(d, steps, warmup=False) < 0.02           # the 300-step LoRA run: ~1.5%
    assert kept_fraction(d, 60, warmup=True) == pytest.approx(0.9)  # the warm-up keeps 90% at any length
    assert ema_warmup_on(None, lora_rank=4) and not ema_warmup_on(None, lora_rank=0)
    assert not ema_warmup_on(False, lora_rank=4) and ema_warmup_on(True, lora_rank=0)


def test_the_horizon_note_warns_only_when_the_ema_would_erase_the_run():
    note = ema_horizon_note(0.9999, 300, warmup=False)
    assert note.startswith("warning: ema.decay 0.9999 over 300 steps keeps 1.5% of what the adapters learned")
    assert "ema.warmup=true" in note and "keeps 90%" in note and "ema.decay 0.967" in note
    assert not ema_horizon_note(0.9999, 300, warmup=True).startswith("warning")
    assert "keeps 90%" in ema_horizon_note(0.9999, 300, warmup=True)


def test_adamw_ema_follows_a_decay_named_one_step_ahead():
    shapes = [(4, 3), (5,)]
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    ref_params = [p.detach().clone().requires_grad_() for p in params]
    opt, ref_opt = AdamWEMA(params, lr=1e-2), torch.optim.AdamW(ref_params, lr=1e-2, foreach=True)
    ema = [p.detach().clone() for p in params]
    ref_ema = [p.detach().clone() for p in ref_params]
    opt.attach_ema(ema, [p.detach() for p in params])
    for step in range(8):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for p, q, g in zip(params, ref_params, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
        decay = ema_decay(0.99, step, warmup=True)
        for e, p in zip(ref_ema, ref_params):
            e.lerp_(p.detach(), 1 - decay)
        if not opt.take_ema_update(decay, next_decay=ema_decay(0.99, step + 1, warmup=True)):
            assert step == 0
            torch._foreach_lerp_(opt._ema_targets, opt._ema_sources, 1 - decay)
    for e, r in zip(ema, ref_ema):
        torch.testing.assert_close(e, r, atol=1e-6, rtol=1e-6)
    opt.step()
    with pytest.raises(ValueError, match="one step ahead"):
        opt.take_ema_update(0.7)  # the step used the warm-up's decay (9 / 18), not 0.7
