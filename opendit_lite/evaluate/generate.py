"""Generate the evaluation samples over all ranks into one ``samples.npz`` (DiT's sample_ddp
convention: ``arr_0`` uint8 [N, H, W, 3], here with ``labels`` [N] beside it), optionally also as
``samples/<index>.png``.

Each data-parallel rank samples its block of the N = classes x ``eval.samples_per_class`` global
indices (sample i has label i // samples_per_class and noise from (sample.seed, i), so the file does
not depend on the number of ranks), writes it as ``part-<dp rank>.npz``, and rank 0 joins the parts
in index order once every rank is done.
"""

import os

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image

from ..sampling import SamplingRanks
from ..sampling.fast import fast_sampling
from ..sampling.image import class_labels, image_batches, load_image_model
from .images import save_npz


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """images [n, 3, H, W] in [-1, 1] -> uint8 [n, H, W, 3] (DiT's rounding)."""
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def generate_samples(cfg, ranks: SamplingRanks, out_dir: str, save_png: bool = False) -> str:
    """Sample every class ``cfg.eval.samples_per_class`` times over all ranks; returns the path of
    ``samples.npz`` (written by rank 0; every rank returns it once the file is complete)."""
    model, ckpt, vae, _ = load_image_model(cfg, ranks)
    fast = fast_sampling(model, cfg, ranks)  # sample.cfg_parallel and sample.cache apply here too
    labels = class_labels(cfg.model.num_classes, None, cfg.eval.samples_per_class)
    parts, png_dir = os.path.join(out_dir, "parts"), os.path.join(out_dir, "samples")
    os.makedirs(parts, exist_ok=True)
    if save_png:
        os.makedirs(png_dir, exist_ok=True)
    if ranks.is_main:
        print(f"generating {len(labels)} samples ({cfg.model.num_classes} classes x {cfg.eval.samples_per_class}) "
              f"from {ckpt} on {ranks.dp_size} data-parallel x {ranks.cfg_size} guidance-branch x {ranks.sp_size} "
              f"sequence-parallel ranks")
    images, indices = [], []
    for batch_indices, batch in image_batches(model, cfg, labels, ranks, vae, fast=fast):
        if not ranks.holds_result:  # a sequence-parallel or guidance-branch peer: its group's first rank's images
            continue
        arr = to_uint8(batch)                                                  # [b, H, W, 3]
        images.append(arr)
        indices.extend(batch_indices)
        if save_png:
            for i, img in zip(batch_indices, arr):
                Image.fromarray(img).save(os.path.join(png_dir, f"{i:06d}.png"))
    if ranks.holds_result and indices:
        save_npz(os.path.join(parts, f"part-{ranks.dp_rank:05d}.npz"), np.concatenate(images),
                 indices=np.asarray(indices, np.int64))
    if ranks.world_size > 1:
        dist.barrier()
    path = os.path.join(out_dir, "samples.npz")
    if ranks.is_main:
        names = sorted(f for f in os.listdir(parts) if f.startswith("part-") and f.endswith(".npz"))
        blocks, order = [], []
        for name in names:
            with np.load(os.path.join(parts, name)) as part:
                blocks.append(part["arr_0"])
                order.append(part["indices"])
        order = np.concatenate(order)
        if sorted(order.tolist()) != list(range(len(labels))):
            raise RuntimeError(f"the sample parts in {parts!r} do not cover indices 0..{len(labels) - 1} exactly")
        arr = np.concatenate(blocks)[np.argsort(order)]
        save_npz(path, arr, labels=np.asarray(labels, np.int64))
        for name in names:
            os.remove(os.path.join(parts, name))
        os.rmdir(parts)
    if ranks.world_size > 1:
        dist.barrier()
    return path
