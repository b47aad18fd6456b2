"""The embedded video default: short clips of one coloured shape moving across a dark frame, each
with a caption ("a red square moving right"), generated on the fly so the demo needs no download.

Captions are turned into text states without a text encoder: every word of the small vocabulary
has a fixed random vector (seeded), and a caption's states are its words' vectors, one token per
word, padded with zeros to ``max_tokens`` (with a mask). That is enough conditioning for a tiny
model to learn colour, shape and direction on CPU, and it has the same layout as T5 states.
"""

import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset

COLORS: Dict[str, Tuple[float, float, float]] = {"red": (1.0, -0.8, -0.8), "green": (-0.8, 1.0, -0.8),
                                                 "blue": (-0.8, -0.8, 1.0), "yellow": (1.0, 1.0, -0.8)}
SHAPES = ("square", "disc")
DIRECTIONS: Dict[str, Tuple[int, int]] = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}


def caption_states(caption: str, max_tokens: int, channels: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Caption -> (states [max_tokens, channels], bool mask [max_tokens]) from per-word fixed vectors."""
    words = caption.lower().split()[:max_tokens]
    states = torch.zeros(max_tokens, channels)
    for i, word in enumerate(words):
        seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
        states[i] = torch.randn(channels, generator=torch.Generator().manual_seed(seed))
    mask = torch.arange(max_tokens) < len(words)
    return states, mask


class MovingShapesDataset(Dataset):
    """Clips [3, T, H, W] in [-1, 1] with captions; item = (clip, states, mask, caption).

    ``shapes``: optional list of (frames, height, width); sample i is then generated at
    ``shapes[i % len(shapes)]`` (its ``sample_shapes`` entry, what a bucket sampler groups by), and an
    index ``(i, frames, height, width)`` renders sample i at that size (a 1-frame sample is an image).
    """

    def __init__(self, num_samples: int = 256, num_frames: int = 4, image_size: int = 16,
                 max_tokens: int = 8, caption_channels: int = 32, seed: int = 0,
                 shapes: Optional[Sequence[Tuple[int, int, int]]] = None):
        shapes = [tuple(s) for s in shapes] if shapes else [(num_frames, image_size, image_size)]
        if min(min(h, w) for _, h, w in shapes) < 8:
            raise ValueError(f"moving shapes need frames of at least 8x8 pixels, got {shapes}")
        self.num_samples, self.num_frames, self.image_size = num_samples, num_frames, image_size
        self.max_tokens, self.caption_channels, self.seed = max_tokens, caption_channels, seed
        self.sample_shapes = [shapes[i % len(shapes)] for i in range(num_samples)]

    def __len__(self) -> int:
        return self.num_samples

    @staticmethod
    def all_captions() -> List[str]:
        return [f"a {c} {s} moving {d}" for c in COLORS for s in SHAPES for d in DIRECTIONS]

    def __getitem__(self, index):
        index, frames, height, width = index if isinstance(index, tuple) else (index, *self.sample_shapes[index])
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        color = list(COLORS)[int(torch.randint(len(COLORS), (1,), generator=g))]
        shape = SHAPES[int(torch.randint(len(SHAPES), (1,), generator=g))]
        direction = list(DIRECTIONS)[int(torch.randint(len(DIRECTIONS), (1,), generator=g))]
        caption = f"a {color} {shape} moving {direction}"
        clip = self.render(color, shape, direction, int(torch.randint(1 << 16, (1,), generator=g)),
                           frames, height, width)
        states, mask = caption_states(caption, self.max_tokens, self.caption_channels)
        return clip, states, mask, caption

    @staticmethod
    def render(color: str, shape: str, direction: str, offset: int, frames: int, height: int,
               width: int) -> torch.Tensor:
        """The clip [3, T, H, W]: the shape advances one step per frame, wrapping at the border."""
        size, T = min(height, width), frames
        radius = max(size // 6, 1)
        step = max(size // 8, 1)
        dy, dx = DIRECTIONS[direction]
        cy, cx = offset % height, (offset // height) % width
        ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        clip = torch.full((3, T, height, width), -1.0)
        rgb = torch.tensor(COLORS[color])[:, None, None]
        for t in range(T):
            y, x = (cy + dy * step * t) % height, (cx + dx * step * t) % width
            # Distances on the torus, so a shape leaving one side enters the other.
            ddy = torch.minimum((ys - y).abs(), height - (ys - y).abs())
            ddx = torch.minimum((xs - x).abs(), width - (xs - x).abs())
            inside = (ddy <= radius) & (ddx <= radius) if shape == "square" else ddy ** 2 + ddx ** 2 <= radius ** 2
            clip[:, t] = torch.where(inside, rgb, clip[:, t])
        return clip
