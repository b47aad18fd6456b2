"""Encode an image folder once with the VAE and write latent shards that train.py reads
(``data.type=latents data.path=<output>``).

    python scripts/extract_latents.py --data-path /data/imagenet/train --vae-path /models/sd-vae-ft-ema \
        --image-size 256 --output /data/imagenet256_latents

Each image is centre-cropped like DiT, encoded (the posterior is sampled once; pass --mode to store
its mean) and scaled by --scale-factor. Progress is shown; shards are written as they fill, so an
interrupted run keeps what it finished.
"""

import argparse
import os
import sys

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opendit_lite.data import build_image_folder  # noqa: E402
from opendit_lite.data.latents import write_latent_meta, write_latent_shard  # noqa: E402
from opendit_lite.encoders import load_vae, vae_encode  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-path", required=True, help="image folder with one sub-folder per class")
    p.add_argument("--vae-path", required=True, help="local diffusers AutoencoderKL folder")
    p.add_argument("--output", required=True, help="folder for shard_*.safetensors and meta.json")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--shard-size", type=int, default=4096, help="latents per shard file")
    p.add_argument("--scale-factor", type=float, default=0.18215)
    p.add_argument("--mode", action="store_true", help="store the posterior mean instead of a sample")
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = build_image_folder(args.data_path, args.image_size, random_flip=False)
    vae = load_vae(args.vae_path, device=device)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers)
    os.makedirs(args.output, exist_ok=True)

    buf_x, buf_y, shard, count = [], [], 0, 0
    for images, labels in tqdm(loader, desc="encoding", unit="batch"):
        z = vae_encode(vae, images.to(device), args.scale_factor, sample=not args.mode)
        buf_x.append(z.float().cpu())
        buf_y.append(labels)
        count += len(labels)
        if sum(len(y) for y in buf_y) >= args.shard_size:
            write_latent_shard(args.output, shard, torch.cat(buf_x), torch.cat(buf_y))
            buf_x, buf_y, shard = [], [], shard + 1
    if buf_y:
        write_latent_shard(args.output, shard, torch.cat(buf_x), torch.cat(buf_y))
    c, h, w = z.shape[1:]
    write_latent_meta(args.output, {"channels": c, "height": h, "width": w, "count": count,
                                    "scale_factor": args.scale_factor, "classes": dataset.classes,
                                    "image_size": args.image_size})
    print(f"wrote {count} latents [{c}, {h}, {w}] to {args.output}")


if __name__ == "__main__":
    main()
