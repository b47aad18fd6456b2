"""A DistributedSampler that can start mid-epoch, so a resumed run sees exactly the batches the
interrupted run would have seen next (no skipped or repeated samples, no data loaded to skip)."""

from typing import Iterator

from torch.utils.data.distributed import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` plus ``set_start_index(i)``: the next epoch's iteration begins at this
    rank's ``i``-th index of that epoch's (seed + epoch) permutation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_index = 0

    def set_start_index(self, start_index: int) -> None:
        if not 0 <= start_index <= self.num_samples:
            raise ValueError(f"start_index {start_index} outside 0..{self.num_samples} (samples per rank and epoch)")
        self.start_index = start_index

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start_index:])

    def __len__(self) -> int:
        return self.num_samples - self.start_index
