"""AdamW whose step also advances the EMA of the weights it just updated, all in multi-tensor ops.

A training step ends with two walks over the fp32 weights: the optimizer's update, then the EMA's
``ema += (1 - decay) * (w - ema)``. ``AdamWEMA.step`` does both in one call with
``torch._foreach_*`` ops: each line of the AdamW update below is one multi-tensor launch over
every parameter of a group (no per-parameter launches), and the EMA lerp one more over every EMA
piece, while the weights are still hot in cache.

The update is torch's AdamW (decoupled weight decay), written as torch's multi-tensor
implementation writes it, so the weights equal ``torch.optim.AdamW(foreach=True)`` step for step
and ``torch.optim.AdamW`` in any implementation within fp32 rounding::

    w      *= 1 - lr * weight_decay
    m      = lerp(m, g, 1 - beta1)
    v      = beta2 * v + (1 - beta2) * g * g
    w     -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

The optimizer state has torch's AdamW keys (``step``, ``exp_avg``, ``exp_avg_sq``) so checkpoints
load into either. What it updates is whatever it was given: the model's parameters (DDP) or, once
Colossal-AI's LowLevelZero has replaced the parameter groups, the fp32 master shards (ZeRO-1/2).

The EMA: ``attach_ema(targets, sources)`` gives the EMA tensors and the tensors they average
(the sharded EMA's pieces and the slices of weights or master shards they follow). The decay is
the one ``take_ema_update(decay)`` named after the previous step; until then (the first step)
``step`` leaves the EMA alone and ``take_ema_update`` tells the caller to update it itself, so the
sequence of EMA updates is exactly that of calling the EMA after every step (see
``OpenDiTPlugin.update_ema``). A decay that changes from step to step (the EMA's warm-up) is named
one step ahead: ``take_ema_update(decay, next_decay)`` checks the step just taken used ``decay`` and
sets ``next_decay`` for the next one.
"""

import math
from typing import Iterable, List, Optional, Sequence, Tuple

import torch
from torch.optim import Optimizer


class AdamWEMA(Optimizer):
    """AdamW (torch's algorithm, multi-tensor) plus an optional EMA lerp in the same ``step``.

    Args: as ``torch.optim.AdamW`` (``params``, ``lr``, ``betas``, ``eps``, ``weight_decay``); no
    amsgrad, maximize or capturable variants.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"AdamWEMA: invalid lr={lr}, betas={betas}, eps={eps} or weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._ema_targets: List[torch.Tensor] = []
        self._ema_sources: List[torch.Tensor] = []
        self.ema_decay: Optional[float] = None
        self._ema_done = False  # the last step() advanced the EMA and no take_ema_update has seen it

    # ------------------------------------------------------------------ EMA

    def attach_ema(self, targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
        """Average ``sources`` (fp32 weights or slices of them, updated by this optimizer) into
        ``targets`` (fp32 EMA tensors of the same shapes) at every step from the next
        ``take_ema_update`` on."""
        if len(targets) != len(sources) or any(t.shape != s.shape for t, s in zip(targets, sources)):
            raise ValueError("AdamWEMA.attach_ema: targets and sources must be lists of tensors of equal shapes")
        bad = [t.dtype for t in (*sources, *targets) if t.dtype != torch.float32]
        if bad:
            raise ValueError(f"AdamWEMA.attach_ema averages fp32 tensors in place; got {sorted(set(map(str, bad)))}")
        self._ema_targets, self._ema_sources = list(targets), list(sources)
        self.ema_decay, self._ema_done = None, False

    def take_ema_update(self, decay: float, next_decay: Optional[float] = None) -> bool:
        """Called after each ``step``: True when that step already advanced the EMA with ``decay``;
        False when it did not (the first step, or a step skipped by a loss scaler), after which the
        caller updates the EMA itself. The next step uses ``next_decay`` (None: ``decay`` again); a
        step that applied another decay than ``decay`` is an error (name changes one step ahead)."""
        next_decay = decay if next_decay is None else next_decay
        for d in (decay, next_decay):
            if not 0.0 <= d <= 1.0:
                raise ValueError(f"EMA decay must be in [0, 1], got {d}")
        done = self._ema_done
        if done and decay != self.ema_decay:
            raise ValueError(
                f"AdamWEMA already advanced the EMA with decay {self.ema_decay} in this step, not {decay}; "
                f"name a decay that changes one step ahead (take_ema_update(decay, next_decay))"
            )
        self._ema_done = False
        self.ema_decay = next_decay
        return done

    # ------------------------------------------------------------------ update

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._adamw_group(group, params)
        if self._ema_targets and self.ema_decay is not None:
            torch._foreach_lerp_(self._ema_targets, self._ema_sources, 1.0 - self.ema_decay)
            self._ema_done = True
        return loss

    def _adamw_group(self, group: dict, params: List[torch.Tensor]) -> None:
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
        for p in params:
            if p.grad.is_sparse:
                raise RuntimeError("AdamWEMA does not support sparse gradients")
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])

        torch._foreach_add_(steps, 1)
        if weight_decay != 0:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        step_sizes = [-lr / (1 - beta1 ** s.item()) for s in steps]            # host scalars: CPU step counters
        bias_correction2_sqrt = [math.sqrt(1 - beta2 ** s.item()) for s in steps]
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, step_sizes)
