"""Precomputed video latents and caption states: one ``.pt`` file per clip holding ``latents``
[C, T, h, w], ``states`` [M, channels], ``mask`` [M] and ``caption``, as written by
``save_video_latents``. Training from them skips the VAE and text encoder entirely.

``scripts/extract_latents.py --family`` also writes ``meta.json`` (``write_video_latent_meta``):
the family and transformer class they were encoded for, the count and shapes; the trainer reads it
(``video_latent_meta``) to refuse latents made for another model.
"""

import glob
import json
import os
from typing import Dict

import torch
from torch.utils.data import Dataset


def save_video_latents(folder: str, index: int, latents: torch.Tensor, states: torch.Tensor,
                       mask: torch.Tensor, caption: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{index:08d}.pt")
    torch.save({"latents": latents.cpu(), "states": states.cpu(), "mask": mask.cpu(), "caption": caption}, path)
    return path


META = "meta.json"


def write_video_latent_meta(folder: str, meta: Dict) -> str:
    path = os.path.join(folder, META)
    with open(path, "w") as f:
        json.dump(meta, f, indent=2)
    return path


def video_latent_meta(folder: str) -> Dict:
    """The folder's ``meta.json`` ({} when it has none, e.g. latents written with ``save_video_latents`` alone)."""
    path = os.path.join(folder, META)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


class VideoLatentDataset(Dataset):
    """item = (latents [C, T, h, w], states [M, channels], mask [M], caption)."""

    def __init__(self, folder: str):
        self.files = sorted(glob.glob(os.path.join(folder, "*.pt")))
        if not self.files:
            raise ValueError(f"no .pt latent files in {folder!r}; write them with save_video_latents")
        self._read(self.files[0])  # the folder's format, checked on its first file before training starts

    @staticmethod
    def _read(path: str) -> Dict:
        try:
            item = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # pickled objects (weights_only refuses them), truncated, not a torch file
            raise ValueError(f"cannot read video latents {path!r} as tensors ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:160]}); write them with save_video_latents") from None
        missing = [k for k in ("latents", "states", "mask", "caption") if not isinstance(item, dict) or k not in item]
        if missing:
            raise ValueError(f"video latents {path!r} lack {', '.join(missing)}; write them with save_video_latents")
        return item

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        item = self._read(self.files[index])
        return item["latents"], item["states"], item["mask"], item["caption"]
