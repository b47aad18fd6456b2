"""Loss parity of precision=fp8 against bf16: the same DiT trained twice from the same seed.

Both runs train DiT-S/2 (default) on the embedded shapes dataset in pixel space (no VAE, nothing
to download) with the IDDPM objective, AdamW and bf16 autocast over fp32 weights, seeing the same
initial weights, batches, timesteps and noise. The fp8 run converts the blocks' Linear layers to
torchao's Float8Linear (``opendit_lite.precision.apply_fp8_training``: the layers ``precision:
fp8`` converts in train.py). Target (issue 15): the fp8 loss curve within 2% of bf16's.

One GPU with FP8 tensor cores (compute capability >= 8.9), from the project root:

    python benchmarks/fp8_parity.py                          # DiT-S/2, 1000 steps, batch 64, 32 px
    python benchmarks/fp8_parity.py --steps 2000 --compile   # both runs torch.compile'd per block

Writes benchmarks/results/fp8_parity_<model>_<gpu>.csv (step, loss per run) and .png (the two
curves smoothed, and their relative difference), and prints the mean loss of the last 10% of the
steps of each run, their relative gap and each run's time per step.
"""

import argparse
import csv
import os
import re
import time
from typing import Dict, List

import torch

from opendit_lite.data import build_dataset
from opendit_lite.diffusion import build_scheduler
from opendit_lite.diffusion.loss import objective_loss
from opendit_lite.models import build_model
from opendit_lite.precision import apply_fp8_training, check_fp8_supported
from opendit_lite.utils.exit_codes import script_main

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def train(args: argparse.Namespace, fp8: bool, device: torch.device) -> Dict[str, List[float]]:
    """One run; returns the per-step losses and the step times (ms, after the first 10 steps)."""
    torch.manual_seed(args.seed)
    dataset = build_dataset("shapes", image_size=args.image_size, num_samples=args.num_samples, seed=args.seed)
    model = build_model(args.model, input_size=args.image_size, in_channels=3, num_classes=len(dataset.classes),
                        learn_sigma=True).to(device).train()
    if fp8:
        apply_fp8_training(model)
    if args.compile:
        for block in model.get_fsdp_wrap_module_list():
            block.compile()
    objective = build_scheduler("iddpm", noise_schedule="linear", learn_sigma=True, diffusion_steps=1000)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=device.type == "cuda")
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(args.seed),
                                         num_workers=args.workers)
    torch.manual_seed(args.seed + 1)  # timesteps and noise: the same draws in both runs
    losses, times, step = [], [], 0
    while step < args.steps:
        for x, y in loader:
            if step == args.steps:
                break
            start = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = objective_loss(objective, model, x, dict(y=y))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            if step >= 10:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append((time.perf_counter() - start) * 1e3)
            step += 1
    return {"loss": torch.stack(losses).float().cpu().tolist(), "ms": times}


def smooth(values: List[float], window: int) -> List[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


@script_main
def main(argv) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="DiT-S/2")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32, help="pixels; DiT-S/2 sees (size / 2)^2 tokens")
    parser.add_argument("--num-samples", type=int, default=65536)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=4, help="data loader processes drawing the shapes")
    parser.add_argument("--compile", action="store_true", help="torch.compile each block in both runs")
    parser.add_argument("--out-dir", default=RESULTS_DIR)
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_fp8_supported(device)  # the same refusal as precision=fp8 in train.py
    gpu = torch.cuda.get_device_name(device)
    runs = {"bf16": train(args, fp8=False, device=device), "fp8": train(args, fp8=True, device=device)}

    tail = max(1, args.steps // 10)
    final = {name: sum(r["loss"][-tail:]) / tail for name, r in runs.items()}
    gap = final["fp8"] / final["bf16"] - 1
    ms = {name: sorted(r["ms"])[len(r["ms"]) // 2] if r["ms"] else float("nan") for name, r in runs.items()}
    print(f"{args.model} on {gpu}, {args.steps} steps, batch {args.batch_size}, seed {args.seed}"
          f"{', compiled' if args.compile else ''}")
    for name in runs:
        print(f"  {name}: mean loss over the last {tail} steps {final[name]:.5f}, median step {ms[name]:.1f} ms")
    print(f"  fp8 vs bf16: loss {gap:+.2%} (target within 2%), step time x{ms['bf16'] / ms['fp8']:.2f}")

    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, re.sub(r"[^A-Za-z0-9]+", "_", f"fp8_parity_{args.model}_{gpu}").strip("_"))
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "loss_bf16", "loss_fp8", "device", "torch"])
        for i, (a, b) in enumerate(zip(runs["bf16"]["loss"], runs["fp8"]["loss"])):
            writer.writerow([i + 1, f"{a:.6g}", f"{b:.6g}", gpu, torch.__version__])

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = max(1, args.steps // 50)
    curves = {name: smooth(r["loss"], window) for name, r in runs.items()}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in curves.items():
        left.plot(range(1, len(curve) + 1), curve, label=f"{name} (final {final[name]:.4f})")
    left.set_xlabel("step")
    left.set_ylabel(f"training loss (moving mean over {window} steps)")
    left.legend()
    rel = [b / a - 1 for a, b in zip(curves["bf16"], curves["fp8"])]
    right.plot(range(1, len(rel) + 1), [100 * r for r in rel])
    for bound in (-2, 2):
        right.axhline(bound, color="gray", linestyle="--")
    right.set_xlabel("step")
    right.set_ylabel("fp8 / bf16 - 1 (%)")
    fig.suptitle(f"{args.model}: fp8 vs bf16 on {gpu}, seed {args.seed}")
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)
    print(f"wrote {stem}.csv and {stem}.png")


if __name__ == "__main__":
    main()
