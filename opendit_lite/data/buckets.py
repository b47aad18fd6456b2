"""Buckets of clip shapes: train on many resolutions, aspect ratios and durations in one run.

A bucket is one clip shape (frames, height, width) in pixels with its own batch size, a relative
probability of being drawn and a loss weight. An image is a 1-frame sample, so a 1-frame bucket is
an image bucket and one run mixes images and videos. Buckets are described in the config as a
list, each either by explicit size or by a resolution name and an aspect ratio::

    data:
      buckets:
        - {frames: 16, resolution: 240p, aspect_ratio: "16:9", batch_size: 4}
        - {frames: 1, height: 256, width: 256, batch_size: 32, probability: 0.5, loss_weight: 0.5}

``resolution`` names a pixel area (``RESOLUTIONS``: 144p = 144 x 256 pixels ... 1080p); the height
and width are the aspect ratio (height:width is ``aspect_ratio`` "w:h" as screens are named, so
"16:9" is landscape) at that area, rounded to a multiple of ``size_multiple`` (patch size x VAE
downsampling).

Assignment: a sample of shape (T, H, W) goes to the bucket it can fill without upsampling (bucket
frames <= T, bucket height x width <= H x W) whose aspect ratio is closest to its own; ties go to
more frames, then more pixels. A sample that fits no bucket is left out (counted and reported).

Sampling (``BucketBatchSampler``): at every step all data-parallel ranks draw the same bucket, and
each rank takes its own ``batch_size`` slice of the next ``batch_size x dp_size`` samples of that
bucket's shuffled list. The ranks of one sequence-parallel group share a data-parallel rank, hence
their batches. The draw at step k of epoch e uses a generator seeded by (seed, e, k) and picks among
the buckets that still hold a full global batch, with weights ``probability``; the epoch ends when
none does (what is left of each bucket, less than one global batch, waits for the next epoch's
shuffle). The position is the epoch, the step and one cursor per bucket, all counted in samples:
resuming at another world size continues each bucket at its cursor, so no sample of the epoch is
repeated or skipped.
"""

import math
import random
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

# Resolution name -> pixel area (height x width of its 16:9 frame; "256"/"512" squares).
RESOLUTIONS: Dict[str, int] = {
    "144p": 144 * 256, "240p": 240 * 426, "256": 256 * 256, "360p": 360 * 640, "480p": 480 * 854,
    "512": 512 * 512, "720p": 720 * 1280, "1080p": 1080 * 1920,
}
BUCKET_KEYS = {"name", "frames", "resolution", "aspect_ratio", "height", "width", "batch_size", "probability",
               "loss_weight"}

Shape = Tuple[int, int, int]  # (frames, height, width) in pixels


@dataclass(frozen=True)
class Bucket:
    name: str
    frames: int
    height: int
    width: int
    batch_size: Optional[int]   # per data-parallel rank; None until the planner sizes it ("auto")
    probability: float = 1.0    # relative weight of drawing this bucket for a step
    loss_weight: float = 1.0    # multiplies the loss of every sample of this bucket

    @property
    def shape(self) -> Shape:
        return self.frames, self.height, self.width

    @property
    def is_image(self) -> bool:
        return self.frames == 1


def _ratio(text) -> float:
    """"16:9" (width:height) -> height / width."""
    try:
        w, h = (float(v) for v in str(text).split(":"))
    except ValueError:
        raise ValueError(f"aspect_ratio {text!r} must read 'width:height', e.g. '16:9'") from None
    return h / w


def resolution_shape(resolution: str, aspect_ratio: str, multiple: int = 16) -> Tuple[int, int]:
    """(height, width) of ``aspect_ratio`` at the pixel area of ``resolution``, both multiples of ``multiple``."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}; known: {', '.join(RESOLUTIONS)}")
    area, r = RESOLUTIONS[resolution], _ratio(aspect_ratio)
    height = max(multiple, round(math.sqrt(area * r) / multiple) * multiple)
    width = max(multiple, round(math.sqrt(area / r) / multiple) * multiple)
    return height, width


def parse_buckets(entries: Sequence[dict], size_multiple: int = 1) -> List[Bucket]:
    """Config entries -> buckets; a ValueError names the entry at fault."""
    buckets = []
    for i, entry in enumerate(entries):
        where = f"data.buckets[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping like {{frames: 16, resolution: 240p, aspect_ratio: '16:9', "
                             f"batch_size: 4}}, got {entry!r}")
        unknown = set(entry) - BUCKET_KEYS
        if unknown:
            raise ValueError(f"{where} has unknown keys {sorted(unknown)}; known: {sorted(BUCKET_KEYS)}")
        if "resolution" in entry:
            height, width = resolution_shape(entry["resolution"], entry.get("aspect_ratio", "1:1"), size_multiple)
        elif "height" in entry and "width" in entry:
            height, width = int(entry["height"]), int(entry["width"])
        else:
            raise ValueError(f"{where} needs either resolution (+ aspect_ratio) or height and width")
        frames = int(entry.get("frames", 1))
        batch = entry.get("batch_size", "auto")
        batch = None if batch == "auto" else int(batch)
        probability, loss_weight = float(entry.get("probability", 1.0)), float(entry.get("loss_weight", 1.0))
        if frames < 1 or height < 1 or width < 1 or (batch is not None and batch < 1):
            raise ValueError(f"{where}: frames, height, width and batch_size must be positive")
        if height % size_multiple or width % size_multiple:
            raise ValueError(f"{where}: {height}x{width} is not a multiple of {size_multiple} (patch size x VAE "
                             f"downsampling); pick sizes that are")
        if probability < 0 or loss_weight < 0:
            raise ValueError(f"{where}: probability and loss_weight must be >= 0")
        name = entry.get("name") or f"{frames}x{height}x{width}"
        buckets.append(Bucket(name, frames, height, width, batch, probability, loss_weight))
    names = [b.name for b in buckets]
    if len(set(names)) != len(names) or len({b.shape for b in buckets}) != len(buckets):
        raise ValueError(f"data.buckets lists a shape or name twice: {names}")
    if not buckets:
        raise ValueError("data.buckets is empty")
    return buckets


def assign_bucket(buckets: Sequence[Bucket], shape: Shape) -> Optional[int]:
    """Index of the bucket a sample of ``shape`` (frames, height, width) trains in, or None."""
    frames, height, width = shape
    best, best_key = None, None
    for i, b in enumerate(buckets):
        if b.frames > frames or b.height * b.width > height * width:
            continue
        key = (-round(abs(math.log((b.height / b.width) / (height / width))), 6), b.frames, b.height * b.width)
        if best_key is None or key > best_key:
            best, best_key = i, key
    return best


class BucketBatchSampler:
    """Batches of ``(index, frames, height, width)`` for one data-parallel rank; see the module docstring.

    ``sample_shapes[i]`` is sample i's own (frames, height, width). Iterating yields the rest of the
    current epoch from the current position; ``position_after(k)`` is the position k batches later,
    which the trainer saves (the loader may have fetched further ahead).
    """

    def __init__(self, buckets: Sequence[Bucket], sample_shapes: Sequence[Shape], dp_rank: int = 0,
                 dp_size: int = 1, seed: int = 0):
        if any(b.batch_size is None for b in buckets):
            raise ValueError("every bucket needs a batch size (bucket_batch=auto asks the planner for them)")
        self.buckets, self.dp_rank, self.dp_size, self.seed = list(buckets), dp_rank, dp_size, seed
        assigned = [assign_bucket(self.buckets, s) for s in sample_shapes]
        self.members: List[List[int]] = [[i for i, a in enumerate(assigned) if a == j] for j in range(len(buckets))]
        self.unassigned = sum(a is None for a in assigned)
        self.epoch, self.step, self.cursors = 0, 0, [0] * len(self.buckets)

    # -- position -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "cursors": list(self.cursors)}

    def load_state_dict(self, state: dict) -> None:
        if len(state["cursors"]) != len(self.buckets):
            raise ValueError(f"the saved bucket position has {len(state['cursors'])} buckets, this run "
                             f"{len(self.buckets)}: resume with the same data.buckets")
        self.epoch, self.step, self.cursors = state["epoch"], state["step"], list(state["cursors"])

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning."""
        self.epoch, self.step, self.cursors = epoch, 0, [0] * len(self.buckets)

    # -- the plan -------------------------------------------------------------------------------
    def _order(self, bucket: int) -> List[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 7919 + bucket)
        members = self.members[bucket]
        return [members[i] for i in torch.randperm(len(members), generator=g).tolist()]

    def _draw(self, step: int, cursors: List[int]) -> Optional[int]:
        """The bucket of ``step`` given the cursors before it, or None at the end of the epoch."""
        weights = [b.probability if len(self.members[j]) - cursors[j] >= b.batch_size * self.dp_size else 0.0
                   for j, b in enumerate(self.buckets)]
        if sum(weights) <= 0:
            return None
        rng = random.Random(self.seed * 1_000_003 + self.epoch * 7919 + step * 104_729 + 17)
        return rng.choices(range(len(weights)), weights=weights)[0]

    def position_after(self, batches: int) -> dict:
        """The position ``batches`` steps after the current one (without moving)."""
        step, cursors = self.step, list(self.cursors)
        for _ in range(batches):
            j = self._draw(step, cursors)
            if j is None:
                return {"epoch": self.epoch + 1, "step": 0, "cursors": [0] * len(self.buckets)}
            cursors[j] += self.buckets[j].batch_size * self.dp_size
            step += 1
        return {"epoch": self.epoch, "step": step, "cursors": cursors}

    def __iter__(self) -> Iterator[List[Tuple[int, int, int, int]]]:
        orders: Dict[int, List[int]] = {}
        step, cursors = self.step, list(self.cursors)
        while True:
            j = self._draw(step, cursors)
            if j is None:
                return
            b = self.buckets[j]
            if j not in orders:
                orders[j] = self._order(j)
            start = cursors[j] + self.dp_rank * b.batch_size
            yield [(i, b.frames, b.height, b.width) for i in orders[j][start:start + b.batch_size]]
            cursors[j] += b.batch_size * self.dp_size
            step += 1

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        count, step, cursors = 0, self.step, list(self.cursors)
        while (j := self._draw(step, cursors)) is not None:
            cursors[j] += self.buckets[j].batch_size * self.dp_size
            step, count = step + 1, count + 1
        return count

    def describe(self) -> str:
        lines = [f"{len(self.buckets)} buckets ({self.unassigned} samples fit none):"]
        for b, members in zip(self.buckets, self.members):
            kind = "images" if b.is_image else "clips"
            lines.append(f"  {b.name}: {b.frames}x{b.height}x{b.width} {kind}, {len(members)} samples, batch "
                         f"{b.batch_size}/rank, p={b.probability:g}, loss weight {b.loss_weight:g}")
        return "\n".join(lines)


class BucketBatches:
    """The endless batch stream of a bucketed loader (the bucket counterpart of
    ``sampler.ResumableBatches``). ``state_dict()`` is the position after the batches handed
    out so far, whatever the loader fetched ahead: ``{epoch, batch_in_epoch, bucket_cursors}``, what
    a checkpoint records and ``position`` / ``load_state_dict`` take back (a position without
    cursors, e.g. from a run without buckets, starts its epoch afresh)."""

    def __init__(self, dataloader, position: Optional[dict] = None):
        self.dataloader, self.sampler = dataloader, dataloader.batch_sampler
        self.load_state_dict(position or {})

    def load_state_dict(self, position: dict) -> None:
        """Continue from a recorded position; takes effect at the next batch."""
        if "bucket_cursors" in position:
            self.sampler.load_state_dict({"epoch": position["epoch"], "step": position["batch_in_epoch"],
                                          "cursors": position["bucket_cursors"]})
        else:
            self.sampler.set_epoch(position.get("epoch", 0))
        self._iter, self._taken = None, 0

    @property
    def epoch(self) -> int:
        return self.sampler.position_after(self._taken)["epoch"]

    def state_dict(self) -> dict:
        p = self.sampler.position_after(self._taken)
        return {"epoch": p["epoch"], "batch_in_epoch": p["step"], "bucket_cursors": p["cursors"]}

    def __iter__(self):
        return self

    def __next__(self):
        if self._iter is None:
            self._iter, self._taken = iter(self.dataloader), 0
        try:
            batch = next(self._iter)
        except StopIteration:
            self.sampler.set_epoch(self.sampler.epoch + 1)
            self._iter, self._taken = iter(self.dataloader), 0
            batch = next(self._iter)
        self._taken += 1
        return batch
