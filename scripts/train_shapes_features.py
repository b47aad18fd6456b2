"""Train the shapes features (``opendit_lite/evaluate/shapes_features.py``) and write their weights.

    python scripts/train_shapes_features.py            # rewrites opendit_lite/evaluate/shapes_features.safetensors
    python scripts/train_shapes_features.py --out /tmp/f.safetensors --steps 200

The network learns, on the CPU in one thread (so that the same command gives the same file on the same
torch), from shapes images of a seed the demo does not train on: the class (cross-entropy) and each
image's drawing parameters (centre y and x, half-extent, colour scale and background level, standardised;
mean squared error), on the uint8 images the evaluation sees, with mild Gaussian pixel noise so that
nearby images get nearby features. It prints the held-out accuracy and regression error.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opendit_lite.data.shapes import ShapesDataset  # noqa: E402
from opendit_lite.evaluate.shapes_features import (  # noqa: E402
    IMAGE_SIZE,
    NUM_CLASSES,
    WEIGHTS_FILE,
    ShapesFeatureNet,
    metadata,
)

DATA_SEED = 1000      # the demo trains on seed 0 (global_seed); these images are others
NOISE_STD = 2.0       # pixel noise of the training inputs, in uint8 levels


def drawing_parameters(dataset: ShapesDataset, index: int) -> torch.Tensor:
    """[5]: (centre y, centre x, half-extent) / side, colour scale, background, as ``render_shape`` draws
    them for sample ``index`` (the same generator, the same draws)."""
    g = torch.Generator().manual_seed(dataset.seed * 1_000_003 + index)
    u = torch.rand(6, generator=g)
    size = dataset.image_size
    r = size * (0.22 + 0.12 * u[0].item())
    margin = r + 1
    cy = margin + (size - 2 * margin) * u[1].item()
    cx = margin + (size - 2 * margin) * u[2].item()
    return torch.tensor([cy / size, cx / size, r / size, 0.85 + 0.15 * u[3].item(), 0.05 + 0.1 * u[4].item()])


def make_split(num: int, offset: int):
    """(uint8 images [num, 3, S, S], labels [num], parameters [num, 5]) of samples offset..offset+num."""
    data = ShapesDataset(num_samples=offset + num, image_size=IMAGE_SIZE, num_classes=NUM_CLASSES, seed=DATA_SEED)
    images, labels, params = [], [], []
    for i in range(offset, offset + num):
        img, label = data[i]                                              # [3, S, S] in [-1, 1]
        images.append(((img + 1) * 127.5).round().clamp(0, 255).to(torch.uint8))
        labels.append(label)
        params.append(drawing_parameters(data, i))
    return torch.stack(images), torch.tensor(labels), torch.stack(params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=WEIGHTS_FILE)
    parser.add_argument("--train-samples", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = time.perf_counter()
    images, labels, params = make_split(args.train_samples, 0)
    val_images, val_labels, val_params = make_split(2048, args.train_samples)
    mean, std = params.mean(0), params.std(0)                             # [5] each: standardised targets
    targets, val_targets = (params - mean) / std, (val_params - mean) / std
    print(f"rendered {len(images)} + {len(val_images)} images in {time.perf_counter() - start:.1f} s")

    net = ShapesFeatureNet()
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps)
    order = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(len(images), (args.batch_size,), generator=order)
        x = images[idx].float() + NOISE_STD * torch.randn(args.batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=order)
        _, logits, regressed = net(x.clamp(0, 255))
        loss = F.cross_entropy(logits, labels[idx]) + F.mse_loss(regressed, targets[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if (step + 1) % 250 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}")

    net.eval()
    with torch.no_grad():
        _, logits, regressed = net(val_images)
    accuracy = (logits.argmax(1) == val_labels).float().mean().item()
    rmse = ((regressed - val_targets) ** 2).mean(0).sqrt()                # [5], in standard deviations
    print(f"held-out: accuracy {accuracy:.4f}, parameter RMSE (std units) {[round(v, 3) for v in rmse.tolist()]}")
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, args.out,
              metadata={**metadata(), "data_seed": str(DATA_SEED), "steps": str(args.steps),
                        "held_out_accuracy": f"{accuracy:.4f}"})
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KiB) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
