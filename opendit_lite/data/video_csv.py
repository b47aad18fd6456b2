"""Videos listed in a CSV of (path, caption), decoded with PyAV.

Each item samples ``num_frames`` frames ``frame_interval`` apart from a random start (the first
frames for ``random_start=False``), resizes the short side to ``image_size`` and centre-crops to a
square: a clip [3, T, S, S] in [-1, 1], with its caption. Relative paths are taken from the CSV's
folder. A video shorter than ``(num_frames - 1) * frame_interval + 1`` frames is an error naming it.

For bucketed training (``opendit_lite.data.buckets``) each row's own size is needed: the optional
columns ``num_frames``, ``height`` and ``width`` give it; rows without them are probed once (PyAV
for videos, PIL for images, which count as 1-frame videos) and the result is cached next to the CSV
in ``<csv>.shapes.json``, keyed by path, size and modification time. An index ``(i, T, H, W)`` then
reads row i as a T-frame clip resized to cover H x W and centre-cropped to it.

Image-conditioned pipelines (image-to-video, edit) read an optional ``image`` column: one file, or
several separated by ``|`` (relative paths from the CSV's folder). ``ConditioningImages`` says how a
dataset reads them: ``first_frame`` (image-to-video: the clip's own first frame as loaded, same resize
and crop, unless the row names a file, which is then resized and cropped as the clip is),
``first_last_frames`` (its first and last frames so, or the two files ``first|last`` a row names) or
``reference`` (edit: required, each resized to the size its pipeline resizes it to). Items are then
``(clip, caption, images)``, ``images`` a list of [3, H, W] in [-1, 1]; ``collate_conditioned`` batches
them (the images as one list per sample: references of one batch may differ in size).
"""

import csv
import json
import os
import random
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from .media_folders import IMAGE_EXTENSIONS, MediaRow, folder_entries, read_media_folders

SHAPE_COLUMNS = ("num_frames", "height", "width")


IMAGE_COLUMN = "image"


def read_video_csv(path: str) -> List[Tuple[str, str]]:
    """Rows (video path, caption); the header must have ``path`` and ``text`` (Open-Sora's names).

    A cheap scan, no decoding: rows without a path or whose file is missing or empty are dropped
    with a warning; an empty caption is kept as "" (the model learns it like the null caption)."""
    return [(row.path, row.caption) for row in read_conditioned_csv(path)]


def read_conditioned_csv(path: str) -> List[MediaRow]:
    """The rows ``read_video_csv`` keeps with their conditioning images (the ``image`` column's files,
    ``|``-separated, resolved from the CSV's folder; () when the column is absent or empty) and their
    CSV line."""
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a file: point data.path at a CSV file with 'path' and 'text' columns")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return _read_rows(path, f)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start} cannot be decoded): save the CSV as "
                         f"UTF-8") from None


def _read_rows(path: str, f) -> List[MediaRow]:
    """The rows of the open CSV ``f`` (see ``read_conditioned_csv``)."""
    reader = csv.DictReader(f)
    if not reader.fieldnames or not {"path", "text"} <= set(reader.fieldnames):
        raise ValueError(f"{path}: the CSV needs a header with 'path' and 'text' columns, got {reader.fieldnames}")
    root = os.path.dirname(os.path.abspath(path))
    rows, dropped, uncaptioned = [], [], []
    for line, row in enumerate(reader, start=2):
        video = (row.get("path") or "").strip()
        full = video if os.path.isabs(video) else os.path.join(root, video)
        if not video or not os.path.isfile(full) or os.path.getsize(full) == 0:
            dropped.append(f"line {line}: {video or '(no path)'}")
            continue
        caption = (row.get("text") or "").strip()
        if not caption:
            uncaptioned.append(line)
        images = tuple(name.strip() for name in (row.get(IMAGE_COLUMN) or "").split("|") if name.strip())
        images = tuple(p if os.path.isabs(p) else os.path.join(root, p) for p in images)
        rows.append(MediaRow(full, caption, images, f"line {line}"))
    if dropped:
        print(f"warning: {path}: skipping {len(dropped)} row(s) whose video is missing or empty, e.g. {dropped[0]}",
              file=sys.stderr)
    if uncaptioned:
        lines = ", ".join(map(str, uncaptioned[:10])) + (f" and {len(uncaptioned) - 10} more" if len(uncaptioned) > 10
                                                         else "")
        every = " (every row: is the caption column named 'text'?)" if len(uncaptioned) == len(rows) else ""
        print(f"warning: {path}: {len(uncaptioned)} row(s) have an empty caption{every}, on line(s) {lines}; they "
              f"train as the empty caption. Write their captions in the 'text' column, or remove the rows.",
              file=sys.stderr)
    if not rows:
        raise ValueError(f"{path}: no row names an existing, non-empty video file")
    return rows


def probe_shape(path: str, frame_interval: int = 1) -> Tuple[int, int, int]:
    """(usable frames at ``frame_interval``, height, width) of a video or image file, from its header."""
    if path.lower().endswith(IMAGE_EXTENSIONS):
        from PIL import Image

        with Image.open(path) as im:
            return 1, im.height, im.width
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        frames = stream.frames or sum(1 for _ in container.decode(video=0))
        height, width = stream.codec_context.height, stream.codec_context.width
    return (frames - 1) // frame_interval + 1, height, width


def read_sample_shapes(csv_path: str, frame_interval: int = 1,
                       kept: Optional[List[str]] = None) -> List[Tuple[int, int, int]]:
    """Each row's (frames, height, width): from the CSV's shape columns, else probed and cached.

    ``kept``: the resolved paths of the rows the dataset kept (``read_video_csv`` drops rows whose
    file is missing or empty), in order; the shapes returned are those rows' only."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    root = os.path.dirname(os.path.abspath(csv_path))
    resolved = [(row, (row.get("path") or "").strip()) for row in rows]
    resolved = [(row, p if os.path.isabs(p) else os.path.join(root, p)) for row, p in resolved]
    if kept is not None:  # the rows read_video_csv kept, in order (a path may repeat)
        selected = []
        for row, path in resolved:
            if len(selected) < len(kept) and path == kept[len(selected)]:
                selected.append((row, path))
        resolved = selected
    given = [tuple(int(row[c]) for c in SHAPE_COLUMNS) if all(row.get(c) not in (None, "") for c in SHAPE_COLUMNS)
             else None for row, _ in resolved]
    return probe_shapes([path for _, path in resolved], frame_interval, csv_path + ".shapes.json", given)


def probe_shapes(paths: Sequence[str], frame_interval: int, cache_path: Optional[str],
                 given: Optional[Sequence[Optional[Tuple[int, int, int]]]] = None) -> List[Tuple[int, int, int]]:
    """Each file's (frames at ``frame_interval``, height, width): ``given`` where not None, else probed
    once and cached in ``cache_path`` (keyed by path, size and modification time; None, or a folder
    that cannot be written: not cached)."""
    cache: Dict[str, list] = {}
    if cache_path and os.path.exists(cache_path):
        with open(cache_path) as f:
            cache = json.load(f)
    shapes, probed = [], False
    for i, path in enumerate(paths):
        if given is not None and given[i] is not None:
            shapes.append(tuple(given[i]))
            continue
        st = os.stat(path)
        key = f"{path}|{st.st_size}|{int(st.st_mtime)}|{frame_interval}"
        if key not in cache:
            cache[key], probed = list(probe_shape(path, frame_interval)), True
        shapes.append(tuple(cache[key]))
    if probed and cache_path:
        try:
            with open(cache_path, "w") as f:
                json.dump(cache, f)
        except OSError:  # a read-only data folder: probed again next time
            pass
    return shapes


def decode_frames(path: str) -> torch.Tensor:
    """All frames of a video file (or the one frame of an image) as uint8 [N, H, W, 3]."""
    if path.lower().endswith(IMAGE_EXTENSIONS):
        import numpy as np
        from PIL import Image

        with Image.open(path) as im:
            return torch.from_numpy(np.array(im.convert("RGB")))[None]
    import av

    with av.open(path) as container:
        frames = [torch.from_numpy(f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path}: no video frames could be decoded")
    return torch.stack(frames)


def resize_center_crop(frames: torch.Tensor, size: int, width: Optional[int] = None) -> torch.Tensor:
    """uint8 [T, H, W, 3] -> float [3, T, size, width] in [-1, 1] (width defaults to size): resize to
    cover size x width keeping the aspect ratio, centre crop."""
    height, width = size, width or size
    x = frames.permute(0, 3, 1, 2).float() / 127.5 - 1                       # [T, 3, H, W]
    H, W = x.shape[-2:]
    scale = max(height / H, width / W)
    x = F.interpolate(x, size=(max(height, round(H * scale)), max(width, round(W * scale))),
                      mode="bilinear", antialias=True, align_corners=False)
    top, left = (x.shape[-2] - height) // 2, (x.shape[-1] - width) // 2
    return x[..., top:top + height, left:left + width].permute(1, 0, 2, 3).clamp(-1, 1)  # [3, T, h, w]


@dataclass(frozen=True)
class ConditioningImages:
    """How a dataset reads its rows' conditioning images: ``mode`` "first_frame" (image-to-video),
    "first_last_frames" (the clip's first and last frames, or both files the row names) or "reference"
    (edit: required, at most ``max_images`` per row, each resized to ``reference_size(height, width)``,
    the size its pipeline resizes it to)."""

    mode: str
    max_images: int = 1
    reference_size: Optional[Callable[[int, int], Tuple[int, int]]] = None


def load_image(path: str) -> torch.Tensor:
    """An image file as uint8 [1, H, W, 3] (a 1-frame clip); a ValueError naming it when it cannot be read."""
    try:
        return decode_frames(path)[:1]  # a video file gives its first frame
    except (OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"{path}: cannot be read as an image ({type(e).__name__}: {e})") from None


def resize_exact(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 [1, H, W, 3] -> float [3, height, width] in [-1, 1], resized without cropping (Lanczos, as
    diffusers' image processors resize a reference image)."""
    import numpy as np
    from PIL import Image

    pil = Image.fromarray(image[0].numpy()).resize((width, height), resample=Image.LANCZOS)
    return torch.from_numpy(np.array(pil)).permute(2, 0, 1).float() / 127.5 - 1                 # [3, h, w]


def collate_conditioned(items: Sequence) -> list:
    """A batch of ``(index, (clip, caption, images))`` -> ``[indices [B], (clips [B, 3, T, H, W],
    captions, images: one list per sample)]``."""
    indices = torch.tensor([index for index, _ in items])
    clips = torch.stack([item[0] for _, item in items])
    return [indices, (clips, [item[1] for _, item in items], [list(item[2]) for _, item in items])]


class VideoCSVDataset(Dataset):
    """item = (clip [3, T, S, S], caption), or with ``images`` (``ConditioningImages``) (clip, caption,
    conditioning images: a list of [3, H, W] in [-1, 1])."""

    def __init__(self, csv_path: Optional[str], num_frames: int = 16, frame_interval: int = 3, image_size: int = 256,
                 random_start: bool = True, images: Optional[ConditioningImages] = None,
                 rows: Optional[Sequence[MediaRow]] = None, shapes_cache: Optional[str] = None):
        """``csv_path``: the CSV to read; or None and ``rows`` read elsewhere (``data.media_folders``),
        their probed sizes cached in ``shapes_cache``."""
        rows = read_conditioned_csv(csv_path) if rows is None else list(rows)
        self.csv_path, self.rows = csv_path, [(row.path, row.caption) for row in rows]
        self.image_paths = [row.images for row in rows]
        self.where = [row.where for row in rows]  # "line 7" of the CSV, or the media file
        self.images, self.shapes_cache = images, shapes_cache
        self._sample_shapes: Optional[List[Tuple[int, int, int]]] = None
        self.num_frames, self.frame_interval = num_frames, frame_interval
        self.image_size, self.random_start = image_size, random_start

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def sample_shapes(self) -> List[Tuple[int, int, int]]:
        """Each row's own (frames at frame_interval, height, width); read or probed on first use."""
        if self._sample_shapes is None and self.csv_path is None:
            self._sample_shapes = probe_shapes([path for path, _ in self.rows], self.frame_interval, self.shapes_cache)
        if self._sample_shapes is None:
            self._sample_shapes = read_sample_shapes(
                self.csv_path, self.frame_interval, kept=[path for path, _ in self.rows])
        return self._sample_shapes

    def sample_path(self, index) -> str:
        """The file behind ``index`` (a row number or a ``(row, frames, height, width)`` tuple)."""
        return self.rows[index[0] if isinstance(index, tuple) else index][0]

    def __getitem__(self, index):
        """``index``: a row number (the configured clip size) or ``(row, frames, height, width)``."""
        index, num_frames, height, width = (index if isinstance(index, tuple) else
                                            (index, self.num_frames, self.image_size, self.image_size))
        path, caption = self.rows[index]
        frames = decode_frames(path)
        span = (num_frames - 1) * self.frame_interval + 1
        if frames.shape[0] < span:
            raise ValueError(f"{path}: {frames.shape[0]} frames, fewer than the {span} needed for "
                             f"num_frames={num_frames} at frame_interval={self.frame_interval}")
        start = random.randint(0, frames.shape[0] - span) if self.random_start else 0
        clip = resize_center_crop(frames[start:start + span:self.frame_interval], height, width)   # [3, T, H, W]
        if self.images is None:
            return clip, caption
        return clip, caption, self._conditioning_images(index, clip)

    def _conditioning_images(self, index: int, clip: torch.Tensor) -> List[torch.Tensor]:
        """Row ``index``'s conditioning images, each [3, H, W] in [-1, 1] (module docstring)."""
        paths = self.image_paths[index]
        if self.images.mode == "first_frame":
            if not paths:
                return [clip[:, 0]]                                                    # [3, H, W]
            return [resize_center_crop(load_image(paths[0]), *clip.shape[-2:])[:, 0]]
        if self.images.mode == "first_last_frames":
            if not paths:
                return [clip[:, 0], clip[:, -1]]                                       # 2 x [3, H, W]
            return [resize_center_crop(load_image(path), *clip.shape[-2:])[:, 0] for path in paths]
        references = []
        for path in paths:
            image = load_image(path)                                                    # [1, H, W, 3]
            height, width = self.images.reference_size(image.shape[1], image.shape[2])
            references.append(resize_exact(image, height, width))
        return references


def media_dataset(kind: str, path, num_frames: int, frame_interval: int, image_size: int, random_start: bool = True,
                  images: Optional[ConditioningImages] = None, require_captions: bool = False) -> VideoCSVDataset:
    """The dataset of captioned media ``data.type`` ``kind`` reads: a CSV (``path`` its file) or folders of
    media and caption files (``path`` a folder or a list of entries, ``data.media_folders``; the probed
    sizes cached in the first folder's ``.shapes.json``)."""
    if kind == "csv":
        return VideoCSVDataset(path, num_frames=num_frames, frame_interval=frame_interval, image_size=image_size,
                               random_start=random_start, images=images)
    rows = read_media_folders(path, require_captions)
    cache = os.path.join(folder_entries(path)[0].path, ".shapes.json")
    return VideoCSVDataset(None, num_frames=num_frames, frame_interval=frame_interval, image_size=image_size,
                           random_start=random_start, images=images, rows=rows, shapes_cache=cache)
