"""Shared pieces of the plugin tests: a tiny DiT, fixed data, a plain single-process reference
(AdamW on the global batch, optional clipping, an unsharded fp32 EMA) and the boosted loop."""

from contextlib import nullcontext
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from colossalai.accelerator import get_accelerator
from colossalai.booster import Booster

from opendit_lite.models import DiT

LR, WEIGHT_DECAY, DECAY = 1e-3, 0.01, 0.9
GLOBAL_BATCH = 8

Batch = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def tiny_dit() -> DiT:
    torch.manual_seed(0)
    # 16 tokens of width 32; no label dropout so that forward passes are deterministic.
    return DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2,
               num_classes=10, class_dropout_prob=0.0, learn_sigma=False)


def make_batches(steps: int, batch: int = GLOBAL_BATCH) -> List[Batch]:
    """The same global batches on every rank: latents, integer timesteps, labels, targets."""
    g = torch.Generator().manual_seed(1234)
    return [
        (torch.randn(batch, 4, 8, 8, generator=g), torch.randint(0, 1000, (batch,), generator=g),
         torch.randint(0, 10, (batch,), generator=g), torch.randn(batch, 4, 8, 8, generator=g))
        for _ in range(steps)
    ]


def loss_fn(model, batch: Batch) -> torch.Tensor:
    x, t, y, target = batch
    return F.mse_loss(model(x, t, y).float(), target)


def reference_run(steps: int, grad_clip: float = 0.0,
                  lazy_ema: bool = False) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """One process, the whole global batch: final weights and the unsharded fp32 EMA of the trainable ones.

    The EMA starts from the initial weights, or with ``lazy_ema`` from the weights after the first step.
    """
    model = tiny_dit()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    ema = None if lazy_ema else {n: p.detach().clone() for n, p in trainable.items()}
    for batch in make_batches(steps):
        loss_fn(model, batch).backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        ema = ema or {n: p.detach().clone() for n, p in trainable.items()}
        for n, p in trainable.items():
            ema[n].mul_(DECAY).add_(p.detach(), alpha=1 - DECAY)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, ema


def local_slice(batch: Batch, dp_rank: int, dp_size: int) -> Batch:
    per_rank = batch[0].shape[0] // dp_size
    return tuple(t[dp_rank * per_rank:(dp_rank + 1) * per_rank] for t in batch)


def boosted_run(plugin, steps: int, accum: int = 1, lazy_ema: bool = False, fused_ema: bool = False):
    """Train the tiny DiT with ``plugin`` on this rank's slice of each global batch.

    The EMA is created right after boosting, or with ``lazy_ema`` by the first ``update_ema``.
    With ``accum`` > 1 each slice is split into micro-batches; all but the last run under
    ``no_sync`` where the strategy has it (otherwise the strategy accumulates reduced gradients).
    Ranks other than 0 perturb their copy of the initial weights: every strategy must start
    from rank 0's, as the single-process reference does. Batches go to the accelerator's current
    device (the CPU here, the GPU on a GPU machine).
    ``fused_ema``: the optimizer advances the EMA in its step (``build_optimizer(fused_ema=True)``).
    Returns the boosted model and optimizer.
    """
    device = get_accelerator().get_current_device()
    booster = Booster(plugin=plugin)
    model = tiny_dit()
    if plugin.rank != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
    optimizer = plugin.build_optimizer(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, fused_ema=fused_ema)
    model, optimizer, *_ = booster.boost(model, optimizer)
    if not lazy_ema:
        plugin.create_ema(model)
    for batch in make_batches(steps):
        micro = [torch.chunk(t.to(device), accum) for t in local_slice(batch, plugin.dp_rank, plugin.dp_size)]
        for i in range(accum):
            last = i == accum - 1
            with nullcontext() if last or not plugin.support_no_sync() else booster.no_sync(model, optimizer):
                booster.backward(loss_fn(model, tuple(m[i] for m in micro)) / accum, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        plugin.update_ema(model, decay=DECAY)
    return model, optimizer


def max_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[k].detach().float().cpu() - b[k].detach().float().cpu()).abs().max().item() for k in a)
