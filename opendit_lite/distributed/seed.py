import random

import numpy as np
import torch


def seed_everything(global_seed: int, rank: int, num_ranks: int) -> int:
    """Seed python, numpy and torch with a different, reproducible seed per rank; returns it.
    Pass the data-parallel rank and size: sequence-parallel peers must share one stream."""
    seed = global_seed * num_ranks + rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed
