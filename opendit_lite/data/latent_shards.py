"""Latents in shards: what ``scripts/extract_latents.py --pipeline`` writes, a few files for many clips,
streamed to training from a local folder or an object store.

The format is mosaicml-streaming's MDS (``index.json`` and ``shard.NNNNN.mds`` files of a few hundred
MiB; its ``MDSWriter`` writes them and its ``StreamingDataset`` reads them, from a local folder or,
with a local cache, from ``s3://``, ``gs://``, ``oci://``, ``azure://``, ``hf://`` and other remotes,
downloading each shard once per node). Every column is an ``ndarray`` or a ``str``: nothing is
unpickled on load. Why MDS rather than webdataset's tar shards or megatron-energon: MDS reads any
sample by its index (tar shards read in order only), so the trainer's own sampler keeps deciding the
order (a permutation per epoch, seeded), which is what makes a run resume mid-epoch under another
world size with exactly the samples it had not seen (``data.resumable_sampler``); energon adds its own
dataset configuration and loader on top of webdataset, more than latents need.

A sample holds ``latents`` [C, T, h, w], each per-sample input of the pipeline's transformer
(``text.<keyword>``: the text, and for image-conditioned pipelines the image inputs and per-sample
null text), its ``caption`` and its CSV ``row``. Tensors are stored as NumPy arrays: bfloat16 as
float32 and bool as uint8, their torch dtypes recorded in ``meta.json`` (``dtypes``) and restored on
load. ``meta.json`` (``video_latents``) also records ``storage: mds`` and each sample's pixel size in
the dataset's order (``sample_sizes``, for buckets); the pipeline's unconditional text is
``null_text.safetensors``.

Each extraction rank writes its own part (``part-<rank>/``); rank 0 merges the parts' indexes into
the folder's ``index.json`` (streaming's ``merge_index``).
"""

import hashlib
import json
import os
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

STORAGE = "mds"
INDEX = "index.json"
NULL_TEXT_SHARDS = "null_text.safetensors"
SHARD_BYTES = 256 << 20  # the size an MDS shard is closed at


def is_url(path: str) -> bool:
    """Whether ``path`` names an object store (``s3://bucket/latents``) rather than a local folder."""
    return isinstance(path, str) and "://" in path


def shard_cache(url: str) -> str:
    """The local folder a remote dataset's files are downloaded to: ``$OPENDIT_SHARD_CACHE`` (else the
    temp folder's ``opendit_shards``), one sub-folder per URL."""
    root = os.environ.get("OPENDIT_SHARD_CACHE") or os.path.join(tempfile.gettempdir(), "opendit_shards")
    return os.path.join(root, hashlib.sha1(url.encode()).hexdigest()[:16])


def fetch(path: str, name: str) -> str:
    """The local path of the file ``name`` of the dataset ``path`` (downloaded into ``shard_cache`` once
    when ``path`` is a URL)."""
    if not is_url(path):
        return os.path.join(path, name)
    from streaming.base.storage.download import CloudDownloader

    local = os.path.join(shard_cache(path), name)
    if not os.path.isfile(local):
        CloudDownloader.direct_download(path.rstrip("/") + "/" + name, local)
    return local


def _to_numpy(value: torch.Tensor) -> np.ndarray:
    value = value.detach().cpu()
    if value.dtype == torch.bool:
        value = value.to(torch.uint8)
    elif value.dtype == torch.bfloat16:  # NumPy has no bfloat16: float32 holds it exactly
        value = value.float()
    return value.numpy()


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.replace("torch.", ""))


class LatentShardWriter:
    """One extraction rank's shards, in ``<out>/part-<rank>/``; the columns are fixed by the first sample."""

    def __init__(self, out: str, rank: int, shard_bytes: int = SHARD_BYTES):
        self.folder, self.shard_bytes = os.path.join(out, f"part-{rank:05d}"), shard_bytes
        self.writer, self.keys = None, None
        self.rows: List[int] = []
        self.dtypes: Dict[str, str] = {}

    def write(self, row: int, latents: torch.Tensor, text: Dict[str, torch.Tensor], caption: str) -> None:
        """One clip: its latents [C, T, h, w] and per-sample inputs (keyword -> one sample's tensor)."""
        tensors = {"latents": latents, **{f"text.{k}": v for k, v in text.items()}}
        if self.writer is None:
            from streaming import MDSWriter

            self.keys = sorted(tensors)
            columns = {"row": "int", "caption": "str", **{k: "ndarray" for k in self.keys}}
            self.writer = MDSWriter(out=self.folder, columns=columns, size_limit=self.shard_bytes)
            self.dtypes = {k: str(v.dtype) for k, v in tensors.items()}
        if sorted(tensors) != self.keys:
            raise ValueError(f"row {row} has the inputs {sorted(tensors)}, the dataset's first sample {self.keys}")
        self.writer.write({"row": int(row), "caption": caption, **{k: _to_numpy(v) for k, v in tensors.items()}})
        self.rows.append(int(row))

    def close(self) -> Dict:
        """Finish the part; returns what the merge needs of it: its rows in order and the tensors' dtypes."""
        if self.writer is not None:
            self.writer.finish()
        return {"rows": self.rows, "dtypes": self.dtypes}


def merge_parts(out: str, parts: Sequence[Dict]) -> Tuple[List[int], Dict[str, str]]:
    """Rank 0, after every part is written: one ``index.json`` over the parts (in rank order); returns the
    rows in the dataset's order and the tensors' dtypes."""
    from streaming.base.util import merge_index

    indexes = [os.path.join(out, f"part-{rank:05d}", INDEX) for rank, part in enumerate(parts) if part["rows"]]
    merge_index(indexes, out, keep_local=True)
    rows = [row for part in parts for row in part["rows"]]
    dtypes = next((part["dtypes"] for part in parts if part["dtypes"]), {})
    return rows, dtypes


def save_null_text_shards(folder: str, text: Dict[str, torch.Tensor]) -> str:
    from safetensors.torch import save_file

    path = os.path.join(folder, NULL_TEXT_SHARDS)
    save_file({k: v.detach().cpu().contiguous() for k, v in text.items()}, path)
    return path


def load_null_text_shards(path: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(fetch(path, NULL_TEXT_SHARDS))


def latent_index(index, sizes: Sequence[Tuple[int, ...]], where) -> int:
    """The row of a latent dataset's ``index``: a row, or a bucket's ``(row, frames, height, width)``, which
    must be the row's own size (latents are not resized; a ValueError naming ``where(row)`` otherwise)."""
    if not isinstance(index, tuple):
        return index
    row, *shape = index
    if tuple(shape) != tuple(sizes[row]):
        raise ValueError(f"{where(row)} holds a {'x'.join(map(str, sizes[row]))} clip, not the "
                         f"{'x'.join(map(str, shape))} of its bucket: latents are not resized; list their exact "
                         f"sizes in data.buckets")
    return row


def is_sharded(meta: Dict) -> bool:
    return meta.get("storage") == STORAGE


def check_shards(path: str) -> None:
    """A ValueError naming the first shard of the local dataset ``path`` that is missing or whose size is
    not the one its index records (a copy cut short); a URL's shards are checked as they download."""
    if is_url(path):
        return
    index_path = os.path.join(path, INDEX)
    if not os.path.isfile(index_path):
        raise ValueError(f"{path!r} has no {INDEX}: extract the latents again")
    with open(index_path) as f:
        index = json.load(f)
    for shard in index.get("shards", []):
        info = shard.get("zip_data") or shard["raw_data"]
        file = os.path.join(path, info["basename"])
        if not os.path.isfile(file):
            raise ValueError(f"the shard {info['basename']} of {path!r} is missing; copy the whole folder")
        size = os.path.getsize(file)
        if size != info["bytes"]:
            raise ValueError(f"the shard {info['basename']} of {path!r} holds {size} bytes, its index says "
                             f"{info['bytes']}: the file is cut short or corrupt; copy it again or extract again")


class LatentShards(Dataset):
    """The shards of ``path`` (a local folder or an object store URL) as a map-style dataset: item =
    (latents [C, T, h, w], per-sample inputs {keyword: tensor}, caption); ``sample_shapes`` are the
    clips' pixel sizes (frames, height, width), for buckets (an index ``(i, T, H, W)`` must be clip i's
    size: latents are not resized)."""

    def __init__(self, path: str, meta: Dict):
        self.path, self.dtypes = path, {k: _dtype(v) for k, v in meta.get("dtypes", {}).items()}
        self.sizes = [tuple(s) for s in meta.get("sample_sizes", [])]
        self._data = None
        if not self.sizes:
            raise ValueError(f"{path!r}: meta.json records no sample sizes; extract the latents again")

    @property
    def data(self):
        """streaming's dataset, opened on first use (in each loader worker)."""
        if self._data is None:
            from streaming import StreamingDataset

            if is_url(self.path):
                self._data = StreamingDataset(remote=self.path, local=shard_cache(self.path), shuffle=False,
                                              batch_size=1)
            else:
                self._data = StreamingDataset(local=self.path, shuffle=False, batch_size=1)
            # ``size``: every sample of the shards (``len`` is one rank's share under torchrun; the trainer's
            # sampler indexes the whole dataset on every rank)
            if self._data.size != len(self.sizes):
                raise ValueError(f"{self.path!r} holds {self._data.size} samples but its meta.json "
                                 f"{len(self.sizes)}; extract the latents again")
        return self._data

    def __getstate__(self):  # loader workers open their own
        return {**self.__dict__, "_data": None}

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def sample_shapes(self):
        return self.sizes

    def sample_path(self, index) -> str:
        return f"{self.path} sample {index[0] if isinstance(index, tuple) else index}"

    def __getitem__(self, index):
        sample = self.data[latent_index(index, self.sizes, self.sample_path)]

        def tensor(key):
            value = torch.from_numpy(np.array(sample[key]))
            return value.to(self.dtypes[key]) if key in self.dtypes else value

        text = {k[len("text."):]: tensor(k) for k in sample if k.startswith("text.")}
        return tensor("latents"), text, sample["caption"]


def read_meta(path: str) -> Optional[Dict]:
    """The ``meta.json`` of a latent folder or URL (None when it has none)."""
    try:
        local = fetch(path, "meta.json")
    except Exception as e:  # a remote that cannot be reached or has no meta.json
        raise ValueError(f"cannot read {path}/meta.json ({type(e).__name__}: {e})") from None
    if not os.path.isfile(local):
        return None
    with open(local) as f:
        return json.load(f)
