"""The embedded default dataset: class-conditional images of coloured shapes, generated on the fly.

Nothing is downloaded: sample ``i`` is drawn from a generator seeded by ``(seed, i)``, so the dataset
is identical on every rank and every run. Each class is one (shape, colour) pair, drawn at a random
position and size on a dark background with mild colour jitter, so a small DiT learns it on two CPU
cores in minutes and its samples visibly follow the class label (the rows of the demo's grid).
"""

from typing import List, Tuple

import torch
from torch.utils.data import Dataset

# (name, RGB in [0, 1]) and shape names; class k = (SHAPES[k % 4], COLOURS[k]) for the default 8 classes.
COLOURS: List[Tuple[str, Tuple[float, float, float]]] = [
    ("red", (0.95, 0.15, 0.15)),
    ("green", (0.15, 0.85, 0.25)),
    ("blue", (0.2, 0.35, 0.95)),
    ("yellow", (0.95, 0.9, 0.15)),
    ("magenta", (0.9, 0.2, 0.85)),
    ("cyan", (0.15, 0.85, 0.9)),
    ("orange", (0.98, 0.55, 0.1)),
    ("white", (0.95, 0.95, 0.95)),
]
SHAPES = ("circle", "square", "triangle", "ring")


def class_names(num_classes: int) -> List[str]:
    return [f"{COLOURS[k][0]} {SHAPES[k % len(SHAPES)]}" for k in range(num_classes)]


def _shape_mask(shape: str, size: int, cy: float, cx: float, r: float) -> torch.Tensor:
    """Boolean [size, size] mask of a shape centred at (cy, cx) with half-extent r (pixels)."""
    ys, xs = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
    dy, dx = ys - cy, xs - cx
    if shape == "circle":
        return dy ** 2 + dx ** 2 <= r ** 2
    if shape == "square":
        return (dy.abs() <= r * 0.85) & (dx.abs() <= r * 0.85)
    if shape == "triangle":  # apex up: inside when below the two slanted edges and above the base
        return (dy <= r * 0.8) & (dy >= -r) & (dx.abs() <= (dy + r) * 0.6)
    if shape == "ring":
        d2 = dy ** 2 + dx ** 2
        return (d2 <= r ** 2) & (d2 >= (0.55 * r) ** 2)
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def render_shape(label: int, image_size: int, generator: torch.Generator) -> torch.Tensor:
    """One image [3, S, S] in [-1, 1] of class ``label``."""
    u = torch.rand(6, generator=generator)
    r = image_size * (0.22 + 0.12 * u[0].item())                 # half-extent: 22%..34% of the side
    margin = r + 1
    cy = margin + (image_size - 2 * margin) * u[1].item()
    cx = margin + (image_size - 2 * margin) * u[2].item()
    colour = torch.tensor(COLOURS[label % len(COLOURS)][1]) * (0.85 + 0.15 * u[3].item())
    background = 0.05 + 0.1 * u[4].item()
    mask = _shape_mask(SHAPES[label % len(SHAPES)], image_size, cy, cx, r).float()  # [S, S]
    img = background + mask[None] * (colour[:, None, None] - background)           # [3, S, S]
    return img * 2 - 1


class ShapesDataset(Dataset):
    """``num_samples`` generated (image [3, S, S] in [-1, 1], label) pairs over ``num_classes`` classes."""

    def __init__(self, num_samples: int = 4096, image_size: int = 32, num_classes: int = 8, seed: int = 0):
        if not 1 <= num_classes <= len(COLOURS):
            raise ValueError(f"ShapesDataset supports 1..{len(COLOURS)} classes, got {num_classes}")
        if image_size < 8:
            raise ValueError(f"ShapesDataset needs image_size >= 8 pixels, got {image_size}")
        self.num_samples = num_samples
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed
        self.classes = class_names(num_classes)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = index % self.num_classes
        return render_shape(label, self.image_size, g), label
