import torch


def warmup_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from lr/warmup_steps to lr over ``warmup_steps`` steps, constant after (DiT's
    recipe is a constant LR; warm-up helps larger batches)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    )
