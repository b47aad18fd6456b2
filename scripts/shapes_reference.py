"""Write the embedded shapes data as an FID reference: ``arr_0`` uint8 [N, S, S, 3] (DiT's sample .npz),
rounded as the evaluation rounds samples, for ``eval.reference``.

    python scripts/shapes_reference.py --out outputs/shapes_ref.npz     # the demo's 4096 training images
    python -m opendit_lite.evaluate --config configs/demo.yaml eval.features=shapes \\
        eval.reference=outputs/shapes_ref.npz eval.samples_per_class=128

The defaults are configs/demo.yaml's data: 4096 images of 16 x 16 pixels, seed 0 (its global_seed).
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opendit_lite.data.shapes import ShapesDataset  # noqa: E402
from opendit_lite.evaluate.generate import to_uint8  # noqa: E402
from opendit_lite.evaluate.images import save_npz  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-samples", type=int, default=4096)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = ShapesDataset(num_samples=args.num_samples, image_size=args.image_size, seed=args.seed)
    images = torch.stack([data[i][0] for i in range(len(data))])                     # [N, 3, S, S]
    labels = np.asarray([data[i][1] for i in range(len(data))], np.int64)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_npz(args.out, to_uint8(images), labels=labels)
    print(f"wrote {args.out}: {len(data)} images of {args.image_size}x{args.image_size}, seed {args.seed}")


if __name__ == "__main__":
    main()
