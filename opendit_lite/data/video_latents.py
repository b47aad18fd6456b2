"""Precomputed video latents and caption states: one ``.pt`` file per clip holding ``latents``
[C, T, h, w], ``states`` [M, channels], ``mask`` [M] and ``caption``, as written by
``save_video_latents``. Training from them skips the VAE and text encoder entirely.

``scripts/extract_latents.py --family`` also writes ``meta.json`` (``write_video_latent_meta``):
the family and transformer class they were encoded for, the count and shapes; the trainer reads it
(``video_latent_meta``) to refuse latents made for another model.

Latents extracted from a diffusers pipeline folder (``--pipeline``; ``meta.json`` says
``format: pipeline``, with the pipeline's fingerprint and each file's pixel size) hold the pipeline's
own text inputs instead of states and mask: ``text``, a mapping of transformer keyword to tensor
(``save_pipeline_latents``, read by ``PipelineLatentDataset``), and ``null_text.pt`` holds what the
pipeline feeds its unconditional branch (``save_null_text``). Today's extraction writes shards instead
(``data.latent_shards``: a few files for many clips, streamed from a folder or an object store); a
folder of ``.pt`` files stays readable (``PipelineLatentDataset``), and
``scripts/extract_latents.py --convert <folder> --output <shards>`` converts it.
"""

import glob
import json
import os
from typing import Dict

import torch
from torch.utils.data import Dataset

from .latent_shards import NULL_TEXT_SHARDS, is_url, latent_index, load_null_text_shards, read_meta


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
    """The folder's ``meta.json`` ({} when it has none, e.g. latents written with ``save_video_latents`` alone);
    ``folder`` may be an object store URL of shards (``data.latent_shards``)."""
    if is_url(folder):
        return read_meta(folder) or {}
    path = os.path.join(folder, META)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


PIPELINE_FORMAT = "pipeline"
NULL_TEXT = "null_text.pt"


def save_pipeline_latents(folder: str, index: int, latents: torch.Tensor, text: Dict[str, torch.Tensor],
                          caption: str) -> str:
    """One clip of a pipeline's latents [C, T, h, w] and its text inputs (keyword -> tensor, one sample's)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{index:08d}.pt")
    torch.save({"latents": latents.cpu(), "text": {k: v.cpu() for k, v in text.items()}, "caption": caption}, path)
    return path


def save_null_text(folder: str, text: Dict[str, torch.Tensor]) -> str:
    """The pipeline's unconditional text inputs ([1, ...] per keyword) beside its latents."""
    path = os.path.join(folder, NULL_TEXT)
    torch.save({k: v.cpu() for k, v in text.items()}, path)
    return path


def load_null_text(folder: str) -> Dict[str, torch.Tensor]:
    if is_url(folder) or os.path.isfile(os.path.join(folder, NULL_TEXT_SHARDS)):
        return load_null_text_shards(folder)
    path = os.path.join(folder, NULL_TEXT)
    if not os.path.isfile(path):
        raise ValueError(f"{folder!r} holds no {NULL_TEXT} (what the pipeline feeds its unconditional branch): "
                         f"extract the latents again with scripts/extract_latents.py --pipeline")
    return torch.load(path, map_location="cpu", weights_only=True)


def _read_item(path: str, keys) -> Dict:
    try:
        item = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickled objects (weights_only refuses them), truncated, not a torch file
        raise ValueError(f"cannot read video latents {path!r} as tensors ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:160]})") from None
    missing = [k for k in keys if not isinstance(item, dict) or k not in item]
    if missing:
        raise ValueError(f"video latents {path!r} lack {', '.join(missing)}")
    return item


class PipelineLatentDataset(Dataset):
    """item = (latents [C, T, h, w], text inputs {keyword: tensor}, caption); ``sample_shapes`` are the
    clips' pixel sizes (frames, height, width), recorded at extraction, for buckets: an index
    ``(i, T, H, W)`` reads clip i, which must be of that size (latents cannot be resized)."""

    def __init__(self, folder: str, sizes: Dict[str, list]):
        self.files = sorted(glob.glob(os.path.join(folder, "*.pt")))
        self.files = [f for f in self.files if os.path.basename(f) != NULL_TEXT]
        if not self.files:
            raise ValueError(f"no .pt latent files in {folder!r}; extract them with scripts/extract_latents.py "
                             f"--pipeline")
        unknown = [os.path.basename(f) for f in self.files if os.path.basename(f) not in sizes]
        if unknown:
            raise ValueError(f"{folder!r}: meta.json records no size for {len(unknown)} file(s), e.g. {unknown[0]}; "
                             f"extract the folder again")
        self.sizes = [tuple(sizes[os.path.basename(f)]) for f in self.files]
        _read_item(self.files[0], ("latents", "text", "caption"))

    def __len__(self) -> int:
        return len(self.files)

    @property
    def sample_shapes(self):
        return self.sizes

    def __getitem__(self, index):
        index = latent_index(index, self.sizes, lambda row: self.files[row])
        item = _read_item(self.files[index], ("latents", "text", "caption"))
        return item["latents"], item["text"], item["caption"]


def collate_pipeline_latents(items):
    """A batch of ``(index, (latents, per-sample inputs, caption))`` items of ``PipelineLatentDataset``, batched
    as the default collate does, after a ConfigError naming an input whose shape differs between the samples:
    an edit pipeline's reference latents, each reference resized to the pipeline's size for its aspect ratio."""
    from torch.utils.data import default_collate

    from ..errors import ConfigError

    inputs = [item[1][1] for item in items]
    for key in inputs[0]:
        shapes = sorted({tuple(sample[key].shape) for sample in inputs})
        if len(shapes) > 1:
            raise ConfigError(f"the input {key!r} of the samples of one batch comes in different shapes {shapes}: "
                              f"their conditioning images were resized to different sizes (an edit pipeline resizes "
                              f"each reference by its aspect ratio), and they cannot share a batch. Give references "
                              f"of one aspect ratio, or one sample per batch: global_batch_size equal to the "
                              f"data-parallel ranks.")
    return default_collate(items)


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
