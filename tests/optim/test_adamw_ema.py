"""AdamWEMA: AdamW plus the EMA lerp in one step equals torch.optim.AdamW followed by the EMA update,
step for step, including a learning-rate change, weight decay and the EMA's first (deferred) step."""

import pytest
import torch

from opendit_lite.optim import AdamWEMA

SHAPES = [(7, 5), (3,), (11, 2, 3)]
DECAY = 0.9


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).requires_grad_() for s in SHAPES]


def _grads(step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=gen) for s in SHAPES]


@pytest.mark.parametrize("foreach", [False, True])
def test_equals_torch_adamw_then_ema(foreach):
    ref_params, params = _params(), _params()
    ref_opt = torch.optim.AdamW(ref_params, lr=1e-2, weight_decay=0.1, betas=(0.8, 0.99), foreach=foreach)
    opt = AdamWEMA(params, lr=1e-2, weight_decay=0.1, betas=(0.8, 0.99))
    ref_ema = [p.detach().clone() for p in ref_params]
    # The EMA averages a slice of the first parameter and the whole of the others, as a shard would.
    ema = [params[0].detach().reshape(-1)[3:20].clone()] + [p.detach().clone() for p in params[1:]]
    opt.attach_ema(ema, [params[0].detach().reshape(-1)[3:20]] + [p.detach() for p in params[1:]])
    for step in range(6):
        if step == 3:
            for group in ref_opt.param_groups + opt.param_groups:
                group["lr"] = 3e-3
        for p, q, g in zip(ref_params, params, _grads(step)):
            p.grad, q.grad = g.clone(), g.clone()
        ref_opt.step()
        opt.step()
        for e, p in zip(ref_ema, ref_params):
            e.lerp_(p.detach(), 1 - DECAY)
        if not opt.take_ema_update(DECAY):       # the first step: the caller updates the EMA itself
            assert step == 0
            torch._foreach_lerp_(opt._ema_targets, opt._ema_sources, 1 - DECAY)
    for p, q in zip(ref_params, params):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ema[0], ref_ema[0].reshape(-1)[3:20], atol=1e-6, rtol=1e-6)
    for e, r in zip(ema[1:], ref_ema[1:]):
        torch.testing.assert_close(e, r, atol=1e-6, rtol=1e-6)
    assert set(opt.state[params[0]]) == set(ref_opt.state[ref_params[0]]), "checkpoint keys differ from AdamW's"


def test_first_step_is_left_to_the_caller_and_decay_is_fixed_after():
    params = _params()
    opt = AdamWEMA(params, lr=1e-2)
    opt.attach_ema([p.detach().clone() for p in params], [p.detach() for p in params])
    for p, g in zip(params, _grads(0)):
        p.grad = g
    opt.step()
    assert not opt.take_ema_update(0.9)          # first step: nothing done in the step
    opt.step()
    assert opt.take_ema_update(0.9)
    opt.step()
    with pytest.raises(ValueError, match="decay"):
        opt.take_ema_update(0.5)                 # the step already used 0.9


def test_rejects_non_fp32_ema():
    params = [torch.zeros(3, dtype=torch.bfloat16, requires_grad=True)]
    with pytest.raises(ValueError, match="fp32"):
        AdamWEMA(params).attach_ema([torch.zeros(3)], [params[0].detach()])
