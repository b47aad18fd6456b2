"""Skip samples that fail to decode instead of killing the run.

A dataset that reads files declares ``sample_path(index)``; ``SkipBadSamples`` wraps it, and when
an item raises a decoding error (a truncated image, a broken video) it warns naming the file,
remembers the index (never read again) and returns the next good item instead. When more than
``max_bad_fraction`` of the dataset has failed, the run stops with a ``BadDataError`` (exit code 2)
listing some of the files. Counts are per process: with ``num_workers`` > 0 each worker counts
the items it reads.
"""

import sys
from typing import Set

from torch.utils.data import Dataset

from ..errors import BadDataError

# What decoders raise on a bad file: PIL (OSError, SyntaxError), PyAV (OSError/ValueError
# subclasses), and our datasets' own checks (ValueError, e.g. a video with too few frames).
DECODE_ERRORS = (OSError, ValueError, SyntaxError)


class SkipBadSamples(Dataset):
    def __init__(self, dataset, max_bad_fraction: float):
        self.dataset, self.max_bad_fraction = dataset, max_bad_fraction
        self.bad: Set[int] = set()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name):  # classes, meta, ... of the wrapped dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index):
        """``index``: a row number, or ``(row, *shape)`` from a bucket sampler; a bad row is replaced
        by the next readable one (read at the same shape)."""
        row, shape = (index[0], tuple(index[1:])) if isinstance(index, tuple) else (index, ())
        n = len(self.dataset)
        for offset in range(n):
            i = (row + offset) % n
            if i in self.bad:
                continue
            try:
                return self.dataset[(i, *shape) if shape else i]
            except DECODE_ERRORS as e:
                self._record(i, e)
        raise BadDataError("No sample of the dataset could be read; check data.path.")

    def _record(self, index: int, error: Exception) -> None:
        self.bad.add(index)
        path = self.dataset.sample_path(index)
        print(f"warning: skipping {path}: {type(error).__name__}: {error} ({len(self.bad)} bad so far)",
              file=sys.stderr, flush=True)
        if len(self.bad) > self.max_bad_fraction * len(self.dataset):
            names = ", ".join(self.dataset.sample_path(i) for i in sorted(self.bad)[:5])
            raise BadDataError(
                f"{len(self.bad)} of {len(self.dataset)} samples failed to decode, more than "
                f"max_bad_data_fraction={self.max_bad_fraction} allows (e.g. {names}). Fix or remove those files, or "
                f"raise max_bad_data_fraction to skip them."
            )
