"""The sharded EMA of a model boosted by a data-parallel strategy: built from the boosted model and
its optimizer with the partition of the strategy's fp32 weights, and advanced after each optimizer
step (or inside it, by ``opendit_lite.optim.AdamWEMA``).

The strategy is reached through a small interface (``EMASharding``: the ZeRO degree and the group
the fp32 master weights are sharded over), which ``OpenDiTPlugin`` provides; its ``create_ema`` and
``update_ema`` call the two functions below.

    ema = create_sharded_ema(model, optimizer, plugin)   # after booster.boost; equal to the weights
    for batch in loader:
        ...; optimizer.step()
        update_sharded_ema(ema, optimizer, decay=0.9999)      # or ema_decay(0.9999, step, warmup=True)
    full = ema.state_dict(only_rank_0=True)               # a collective
"""

from typing import Callable, Optional, Protocol

import torch.distributed as dist
from colossalai.interface import ModelWrapper, OptimizerWrapper
from torch.distributed import ProcessGroup

from ..optim import AdamWEMA
from .sharded import ShardedEMA, flat_layout, gemini_layout, zero_layout


class EMASharding(Protocol):
    """How a strategy partitions its fp32 weights, which the EMA follows.

    ``zero_degree``: 0 DDP (every rank holds all fp32 weights: the EMA is a flat partition over the
    world), 1/2 LowLevelZero (the optimizer's fp32 master shards), 3 Gemini (the fp32 master chunks).
    ``zero_group``: the ranks the master weights are sharded over (ranks outside it hold replicas).
    """

    zero_degree: int
    zero_group: ProcessGroup


def fused_ema_optimizer(optimizer: Optional[OptimizerWrapper]) -> Optional[AdamWEMA]:
    """The ``AdamWEMA`` inside a boosted optimizer (DDP's or LowLevelZero's wrapper), else None."""
    inner = getattr(optimizer, "optim", None)
    return inner if isinstance(inner, AdamWEMA) else None


def averaged_parameters(module) -> Callable[[str], bool]:
    """Which trainable parameters of ``module`` the EMA averages, by name: those its ``ema_averages(name)``
    accepts where it declares one (distillation: the student's, not the critic's), else all. The others
    are saved with the EMA as they are, like frozen parameters."""
    declared = getattr(module, "ema_averages", None)
    return declared if declared is not None else (lambda name: True)


def create_sharded_ema(model: ModelWrapper, optimizer: Optional[OptimizerWrapper],
                       sharding: EMASharding) -> ShardedEMA:
    """The sharded fp32 EMA of the boosted ``model`` (its trainable parameters that ``averaged_parameters``
    names), equal to its current weights. ZeRO and Gemini
    read their fp32 master shards from ``optimizer``; an ``AdamWEMA`` inside it is handed the EMA so
    that its step advances it."""
    if not isinstance(model, ModelWrapper):
        raise ValueError("create the EMA after Booster.boost, from the boosted model it returned")
    degree, group = sharding.zero_degree, sharding.zero_group
    if optimizer is None and degree in (1, 2):
        raise ValueError("the ZeRO EMA follows the optimizer's master weights; boost the model with its optimizer "
                         "first")
    module = model.unwrap()
    averaged = averaged_parameters(module)
    if degree == 0:
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad and averaged(n)]
        layout = flat_layout(params, dist.get_world_size(), dist.get_rank())
        group = dist.group.WORLD
    elif degree in (1, 2):
        masters = optimizer.get_working_to_master_map()
        params = [(n, p) for n, p in module.named_parameters() if id(p) in masters and averaged(n)]
        layout = zero_layout(params, optimizer, dist.get_world_size(group))
    elif hasattr(module, "ema_averages"):
        raise ValueError("Gemini's EMA follows its fp32 chunks whole; a module that averages only some of its "
                         "trainable parameters (ema_averages) needs zero_degree 0, 1 or 2")
    else:
        layout = gemini_layout(model, dist.get_world_size(group), dist.get_rank(group))
    ema = ShardedEMA(layout, group, module)
    fused = fused_ema_optimizer(optimizer)
    if fused is not None:
        fused.attach_ema(*ema.pieces_and_sources())
    return ema


def update_sharded_ema(ema: ShardedEMA, optimizer: Optional[OptimizerWrapper], decay: float,
                       next_decay: Optional[float] = None) -> None:
    """``ema = decay * ema + (1 - decay) * weights`` after ``optimizer.step()``, unless an ``AdamWEMA``
    step already did exactly that; ``next_decay`` is the next update's decay when it changes (the
    warm-up of ``decay.ema_decay``), which an ``AdamWEMA`` then applies in its next step."""
    fused = fused_ema_optimizer(optimizer)
    if fused is not None and fused.take_ema_update(decay, next_decay):
        return  # the optimizer's step already advanced the EMA with this decay
    ema.update(decay)
