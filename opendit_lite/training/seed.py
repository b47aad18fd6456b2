import random

import numpy as np
import torch


def seed_everything(global_seed: int, rank: int, world_size: int) -> int:
    """Seed python, numpy and torch with a different, reproducible seed per rank; returns it."""
    seed = global_seed * world_size + rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed
