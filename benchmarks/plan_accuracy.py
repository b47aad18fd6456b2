"""How close the planner's memory model comes to the real peak on a GPU: DiT-XL/2 and STDiT-XL/2,
bf16, one training step (forward, backward, optimizer step, EMA update) at several buckets, world
size 1, against ``torch.cuda.max_memory_allocated``.

    python benchmarks/plan_accuracy.py                   # every case below
    python benchmarks/plan_accuracy.py --models DiT-XL/2 --zero-degree 2

For each (model, bucket, batch) the table has the predicted and measured peak (GiB) and their
ratio; the activation part alone is measured as the allocation growth over the forward pass
(peak during forward minus memory before it). The predicted peak is the planner's: model states
and EMA shard (ZeRO formulas) plus saved activations (``opendit_lite/plan/memory_model.py``); the
planner's reserve (10% + 1 GiB) is not part of the prediction. Results: CSV and Markdown under
benchmarks/results/plan_accuracy_<device>.*; the README quotes them.
"""

import argparse
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from zero_memory import write  # noqa: E402

from opendit_lite.plan.memory_model import GiB, ModelShape, activation_bytes, step_bytes  # noqa: E402

# (model, latent frames, height, width, batch): images for DiT (256 and 512 px, one non-square),
# clips for STDiT (Open-Sora 1.0's 16x256x256 and smaller/larger buckets).
CASES = [
    ("DiT-XL/2", 1, 32, 32, 32), ("DiT-XL/2", 1, 32, 32, 64), ("DiT-XL/2", 1, 64, 64, 8),
    ("DiT-XL/2", 1, 32, 48, 16),
    ("STDiT-XL/2", 16, 32, 32, 2), ("STDiT-XL/2", 16, 32, 32, 4), ("STDiT-XL/2", 8, 18, 32, 8),
    ("STDiT-XL/2", 1, 64, 64, 8),
]


def measure(name: str, frames: int, height: int, width: int, batch: int, zero_degree: int) -> Dict:
    import torch
    from colossalai.booster import Booster

    from opendit_lite.diffusion import build_scheduler
    from opendit_lite.distributed.launch import init_distributed
    from opendit_lite.models import build_model
    from opendit_lite.plugins import OpenDiTPlugin

    init_distributed()
    torch.cuda.empty_cache()
    video = name.startswith("STDiT")
    kwargs = dict(caption_channels=4096, model_max_length=120) if video else dict(input_size=(height, width),
                                                                                  variable_size=True)
    model = build_model(name, in_channels=4, learn_sigma=False, **kwargs)
    shape = ModelShape.of(model, name)
    plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="bf16")
    optimizer = plugin.build_optimizer(model.parameters(), lr=1e-4)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model.cuda(), optimizer)
    plugin.create_ema(model, optimizer)
    rf = build_scheduler("rflow")
    x = torch.randn(batch, 4, frames, height, width, device="cuda") if video else \
        torch.randn(batch, 4, height, width, device="cuda")
    kwargs = dict(y=torch.randn(batch, 120, 4096, device="cuda", dtype=torch.bfloat16),
                  mask=torch.ones(batch, 120, dtype=torch.bool, device="cuda")) if video else \
        dict(y=torch.randint(0, 1000, (batch,), device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = rf.training_losses(model, x, model_kwargs=kwargs)["loss"].mean()
    torch.cuda.synchronize()
    forward_growth = torch.cuda.max_memory_allocated() - before
    booster.backward(loss, optimizer)
    optimizer.step()
    optimizer.zero_grad()
    plugin.update_ema(model, optimizer)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    predicted_act = activation_bytes(shape, frames, height, width, batch, 2,
                                     caption_tokens=120 if video else 0)
    predicted = step_bytes(shape, zero_degree, 1) + predicted_act
    row = {"model": name, "latent": f"{frames}x{height}x{width}", "batch": batch, "zero_degree": zero_degree,
           "predicted_gib": round(predicted / GiB, 2), "measured_peak_gib": round(peak / GiB, 2),
           "ratio": round(predicted / peak, 3), "predicted_act_gib": round(predicted_act / GiB, 2),
           "measured_forward_growth_gib": round(forward_growth / GiB, 2),
           "act_ratio": round(predicted_act / max(forward_growth, 1), 3), "device": torch.cuda.get_device_name()}
    del model, optimizer, plugin, booster, loss
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["DiT-XL/2", "STDiT-XL/2"])
    p.add_argument("--zero-degree", type=int, default=2)
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("plan_accuracy.py measures GPU memory: it needs CUDA (the CPU check is "
                         "tests/plan/test_memory_model.py)")
    rows: List[Dict] = []
    for name, frames, height, width, batch in CASES:
        if name in args.models:
            rows.append(measure(name, frames, height, width, batch, args.zero_degree))
            r = rows[-1]
            print(f"{r['model']:<11} {r['latent']:>9} x{r['batch']:<3} predicted {r['predicted_gib']:6.2f} GiB, "
                  f"peak {r['measured_peak_gib']:6.2f} GiB (ratio {r['ratio']:.3f}); activations "
                  f"{r['predicted_act_gib']:.2f} vs forward growth {r['measured_forward_growth_gib']:.2f} GiB")
    write(rows, args.out_dir, f"plan_accuracy_{rows[0]['device'].replace(' ', '_')}")


if __name__ == "__main__":
    main()
