"""Precomputed latents: encode a dataset once with the VAE, then train from the latent files.

Encoding with the VAE every step dominates a DiT-XL/2 step at 256 px, so precomputing latents is the
largest single speed-up of a DiT training pipeline. ``scripts/extract_latents.py`` writes
``<dir>/shard_00000.safetensors, ...`` each holding ``latents`` [n, C, h, w] (already multiplied by the
VAE scale factor) and ``labels`` [n] int64, plus ``<dir>/meta.json`` (channels, size, classes).
"""

import bisect
import json
import os
from typing import Dict, List

import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset

META = "meta.json"


def write_latent_shard(directory: str, index: int, latents: torch.Tensor, labels: torch.Tensor) -> str:
    path = os.path.join(directory, f"shard_{index:05d}.safetensors")
    save_file({"latents": latents.contiguous().cpu(), "labels": labels.long().contiguous().cpu()}, path)
    return path


def write_latent_meta(directory: str, meta: Dict) -> None:
    with open(os.path.join(directory, META), "w") as f:
        json.dump(meta, f, indent=2)


def read_latent_meta(directory: str, shape) -> Dict:
    """``<directory>/meta.json``, checked: it exists, is a JSON object, and its ``channels``,
    ``height`` and ``width`` match the shards' latent ``shape`` (C, h, w)."""
    path = os.path.join(directory, META)
    if not os.path.isfile(path):
        raise ValueError(f"{path!r} is missing; scripts/extract_latents.py writes it next to the shards (channels, "
                         f"height, width, classes)")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path!r}: {e}") from None
    missing = [k for k in ("channels", "height", "width") if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise ValueError(f"{path!r} lacks {', '.join(missing)}: it must give the latents' channels, height and "
                         f"width (here {list(shape)}), as scripts/extract_latents.py writes them")
    if (meta["channels"], meta["height"], meta["width"]) != tuple(shape):
        raise ValueError(f"{path!r} says channels, height, width = {meta['channels']}, {meta['height']}, "
                         f"{meta['width']} but the shards hold latents of {list(shape)}; re-extract the folder")
    return meta


class LatentDataset(Dataset):
    """(latent [C, h, w], label) pairs from the shards of a latent folder, loaded into memory once."""

    def __init__(self, directory: str, random_flip: bool = False):
        shards = sorted(f for f in os.listdir(directory) if f.startswith("shard_") and f.endswith(".safetensors"))
        if not shards:
            raise ValueError(f"no latent shards (shard_*.safetensors) in {directory!r}; write them with "
                             f"scripts/extract_latents.py")
        self.latents: List[torch.Tensor] = []
        self.labels: List[torch.Tensor] = []
        for name in shards:
            path = os.path.join(directory, name)
            try:
                data = load_file(path)
            except Exception as e:  # truncated or not safetensors
                raise ValueError(f"cannot read latent shard {path!r}: {e}") from None
            if "latents" not in data or "labels" not in data:
                raise ValueError(f"latent shard {path!r} lacks a 'latents' or 'labels' tensor")
            self.latents.append(data["latents"])
            self.labels.append(data["labels"])
        for name, lat, labels in zip(shards, self.latents, self.labels):
            if lat.dim() != 4 or labels.shape != lat.shape[:1]:
                raise ValueError(f"latent shard {os.path.join(directory, name)!r} holds latents "
                                 f"{list(lat.shape)} and labels {list(labels.shape)}; expected [n, C, h, w] and [n]")
            if lat.shape[1:] != self.latents[0].shape[1:]:
                raise ValueError(f"latent shards {shards[0]!r} and {name!r} in {directory!r} hold latents of "
                                 f"different shapes ({list(self.latents[0].shape[1:])} vs {list(lat.shape[1:])}); "
                                 f"one folder holds one image size: extract each size into its own folder")
        self.offsets = [0]
        for lat in self.latents:
            self.offsets.append(self.offsets[-1] + lat.shape[0])
        self.meta = read_latent_meta(directory, tuple(self.latents[0].shape[1:]))
        self.classes = self.meta.get("classes")
        if self.classes:
            for name, labels in zip(shards, self.labels):
                bad = labels[(labels < 0) | (labels >= len(self.classes))]
                if bad.numel():
                    raise ValueError(f"latent shard {os.path.join(directory, name)!r} holds label {int(bad[0])}, "
                                     f"outside 0..{len(self.classes) - 1} (the {len(self.classes)} classes of {META})")
        self.random_flip = random_flip

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index: int):
        shard = bisect.bisect_right(self.offsets, index) - 1
        i = index - self.offsets[shard]
        x = self.latents[shard][i]
        if self.random_flip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, int(self.labels[shard][i])
