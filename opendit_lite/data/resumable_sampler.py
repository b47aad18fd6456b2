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


class ResumableBatches:
    """Endless batches from a loader whose sampler is a ``ResumableDistributedSampler`` (the
    counterpart of ``buckets.BucketBatches`` for one batch shape).

    ``epoch`` and ``batch_in_epoch`` count where the stream stands; ``state_dict()`` is what a
    checkpoint records, and ``load_state_dict`` of it makes a resumed run see exactly the batches
    the uninterrupted run would."""

    def __init__(self, dataloader, micro_batch: int, epoch: int = 0, batch_in_epoch: int = 0):
        self.dataloader, self.micro_batch = dataloader, micro_batch
        self.load_state_dict({"epoch": epoch, "batch_in_epoch": batch_in_epoch})

    def _start(self) -> None:
        self.dataloader.sampler.set_epoch(self.epoch)
        self.dataloader.sampler.set_start_index(self.batch_in_epoch * self.micro_batch)
        self._iter = iter(self.dataloader)

    def state_dict(self) -> dict:
        """The position a checkpoint records: the next batch is ``batch_in_epoch`` of ``epoch``."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, position: dict) -> None:
        """Continue from a recorded position (missing keys: the start of epoch 0); takes effect at
        the next batch."""
        self.epoch, self.batch_in_epoch = position.get("epoch", 0), position.get("batch_in_epoch", 0)
        self._iter = None

    def __iter__(self):
        return self

    def __next__(self):
        if self._iter is None:
            self._start()
        try:
            batch = next(self._iter)
        except StopIteration:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._start()
            batch = next(self._iter)
        self.batch_in_epoch += 1
        return batch
