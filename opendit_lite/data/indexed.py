"""Each training sample paired with its dataset index, so that its random draws can be keyed by it.

The trainers draw a sample's noise, diffusion time and condition dropout from a stream seeded by
(global seed, dataset index, step) rather than from each rank's global generator: a run then gives
the same result on 1 process, 4 ranks or 2 nodes of 2, since which rank or micro-batch a sample
lands in no longer matters. The loader's batches become ``[indices [B], batch]``.
"""

from torch.utils.data import Dataset


class IndexedDataset(Dataset):
    """``dataset[i]`` as ``(i, dataset[i])``; a bucket index ``(i, frames, height, width)`` gives ``i``."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        key = index[0] if isinstance(index, tuple) else index
        return int(key), self.dataset[index]
