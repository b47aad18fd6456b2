"""Videos listed in a CSV of (path, caption), decoded with PyAV.

Each item samples ``num_frames`` frames ``frame_interval`` apart from a random start (the first
frames for ``random_start=False``), resizes the short side to ``image_size`` and centre-crops to a
square: a clip [3, T, S, S] in [-1, 1], with its caption. Relative paths are taken from the CSV's
folder. A video shorter than ``(num_frames - 1) * frame_interval + 1`` frames is an error naming it.
"""

import csv
import os
import random
import sys
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


def read_video_csv(path: str) -> List[Tuple[str, str]]:
    """Rows (video path, caption); the header must have ``path`` and ``text`` (Open-Sora's names).

    A cheap scan, no decoding: rows without a path or whose file is missing or empty are dropped
    with a warning; an empty caption is kept as "" (the model learns it like the null caption)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"path", "text"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: the CSV needs a header with 'path' and 'text' columns, got {reader.fieldnames}")
        root = os.path.dirname(os.path.abspath(path))
        rows, dropped, uncaptioned = [], [], 0
        for line, row in enumerate(reader, start=2):
            video = (row.get("path") or "").strip()
            full = video if os.path.isabs(video) else os.path.join(root, video)
            if not video or not os.path.isfile(full) or os.path.getsize(full) == 0:
                dropped.append(f"line {line}: {video or '(no path)'}")
                continue
            caption = (row.get("text") or "").strip()
            uncaptioned += not caption
            rows.append((full, caption))
    if dropped:
        print(f"warning: {path}: skipping {len(dropped)} row(s) whose video is missing or empty, e.g. {dropped[0]}",
              file=sys.stderr)
    if uncaptioned:
        print(f"warning: {path}: {uncaptioned} row(s) have an empty caption", file=sys.stderr)
    if not rows:
        raise ValueError(f"{path}: no row names an existing, non-empty video file")
    return rows


def decode_frames(path: str) -> torch.Tensor:
    """All frames of a video file as uint8 [N, H, W, 3]."""
    import av

    with av.open(path) as container:
        frames = [torch.from_numpy(f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path}: no video frames could be decoded")
    return torch.stack(frames)


def resize_center_crop(frames: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [T, H, W, 3] -> float [3, T, size, size] in [-1, 1]: short side to ``size``, centre crop."""
    x = frames.permute(0, 3, 1, 2).float() / 127.5 - 1                       # [T, 3, H, W]
    H, W = x.shape[-2:]
    scale = size / min(H, W)
    x = F.interpolate(x, size=(max(size, round(H * scale)), max(size, round(W * scale))),
                      mode="bilinear", antialias=True, align_corners=False)
    top, left = (x.shape[-2] - size) // 2, (x.shape[-1] - size) // 2
    return x[..., top:top + size, left:left + size].permute(1, 0, 2, 3).clamp(-1, 1)  # [3, T, S, S]


class VideoCSVDataset(Dataset):
    """item = (clip [3, T, S, S], caption)."""

    def __init__(self, csv_path: str, num_frames: int = 16, frame_interval: int = 3, image_size: int = 256,
                 random_start: bool = True):
        self.rows = read_video_csv(csv_path)
        self.num_frames, self.frame_interval = num_frames, frame_interval
        self.image_size, self.random_start = image_size, random_start

    def __len__(self) -> int:
        return len(self.rows)

    def sample_path(self, index: int) -> str:
        return self.rows[index][0]

    def __getitem__(self, index: int):
        path, caption = self.rows[index]
        frames = decode_frames(path)
        span = (self.num_frames - 1) * self.frame_interval + 1
        if frames.shape[0] < span:
            raise ValueError(f"{path}: {frames.shape[0]} frames, fewer than the {span} needed for "
                             f"num_frames={self.num_frames} at frame_interval={self.frame_interval}")
        start = random.randint(0, frames.shape[0] - span) if self.random_start else 0
        clip = frames[start:start + span:self.frame_interval]
        return resize_center_crop(clip, self.image_size), caption
