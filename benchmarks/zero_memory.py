"""Model-state memory per GPU under each zero_degree: the ZeRO paper's formulas for 1, 8 and 64 ranks,
and (on a GPU) the measured peak memory of one DiT-XL/2 bf16 training step at world size 1 with the
sharded EMA's own footprint.

    python benchmarks/zero_memory.py                      # formulas only (any machine)
    python benchmarks/zero_memory.py --measure            # + one measured step per zero_degree (CUDA)

Formulas (in ``opendit_lite/plan/memory_model.py``, shared with the planner; Rajbhandari et al.,
"ZeRO", 2020), Psi parameters, mixed precision with Adam: 2 Psi bytes
of bf16 weights, 2 Psi of bf16 gradients and K Psi of optimizer state (fp32 master weights,
momentum and variance: K = 12), over N data-parallel ranks:

    DDP (0):       (2 + 2 + K) Psi
    ZeRO-1 (1):    (2 + 2) Psi + K Psi / N
    ZeRO-2 (2):    2 Psi + (2 + K) Psi / N
    ZeRO-3 (3):    (2 + 2 + K) Psi / N
    sharded EMA:   4 Psi / N (fp32, any degree; DDP included: flat partition over the ranks)

Our DDP keeps fp32 weights and gradients and runs bf16 under autocast, so its row is (4 + 4 + 8) Psi
(Adam's two fp32 moments, no separate master copy). Activations come on top and do not shard with
ZeRO (sequence parallelism and checkpointing address them). Results: CSV and Markdown under
benchmarks/results/, with the device name.
"""

import argparse
import csv
import datetime
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from opendit_lite.plan.memory_model import GiB, ema_bytes, model_state_bytes  # noqa: F401  (the formulas)


def formula_rows(params: int, rank_counts: List[int]) -> List[Dict]:
    return [
        {"zero_degree": z, "ranks": n, "model_state_gib": round(model_state_bytes(z, params, n) / GiB, 2),
         "ema_gib": round(ema_bytes(params, n) / GiB, 2), "source": "formula"}
        for z in range(4) for n in rank_counts
    ]


def measure(zero_degree: int, batch: int) -> Dict:
    """Peak memory of one DiT-XL/2 bf16 step at world size 1 (CUDA), and the EMA's local size."""
    import torch
    from colossalai.booster import Booster

    from opendit_lite.diffusion import create_diffusion
    from opendit_lite.distributed.process_group import init_distributed
    from opendit_lite.models import build_model
    from opendit_lite.plugins import OpenDiTPlugin

    init_distributed()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    plugin = OpenDiTPlugin(zero_degree=zero_degree, precision="bf16")
    model = build_model("DiT-XL/2", input_size=32).cuda()
    optimizer = plugin.build_optimizer(model.parameters(), lr=1e-4)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    plugin.create_ema(model, optimizer)
    diffusion = create_diffusion("")
    x = torch.randn(batch, 4, 32, 32, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    t = torch.randint(0, 1000, (batch,), device="cuda")
    loss = diffusion.training_losses(model, x, t, dict(y=y))["loss"].mean()
    booster.backward(loss, optimizer)
    optimizer.step()
    optimizer.zero_grad()
    plugin.update_ema(model, optimizer)
    torch.cuda.synchronize()
    row = {"zero_degree": zero_degree, "ranks": 1, "batch": batch,
           "peak_gib": round(torch.cuda.max_memory_allocated() / GiB, 2),
           "ema_gib": round(plugin.ema.numel_local() * 4 / GiB, 2), "source": "measured",
           "device": torch.cuda.get_device_name()}
    del model, optimizer, booster, plugin
    return row


def write(rows: List[Dict], out_dir: str, stem: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(os.path.join(out_dir, f"{stem}.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(f"{stem} ({datetime.date.today()})\n\n| " + " | ".join(keys) + " |\n|"
                + "---|" * len(keys) + "\n")
        for r in rows:
            f.write("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=int, default=675_129_632, help="parameters (default: DiT-XL/2 at 256 px)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--measure", action="store_true", help="also measure one step per zero_degree (CUDA)")
    p.add_argument("--batch", type=int, default=32, help="per-GPU batch of the measured step")
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)

    rows = formula_rows(args.params, args.ranks)
    for r in rows:
        print(f"zero {r['zero_degree']}  ranks {r['ranks']:>3}: model states {r['model_state_gib']:>7.2f} GiB, "
              f"EMA {r['ema_gib']:.2f} GiB")
    write(rows, args.out_dir, "zero_memory_formulas")
    if args.measure:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--measure needs a CUDA GPU")
        measured = [measure(z, args.batch) for z in range(4)]
        for r in measured:
            print(f"measured zero {r['zero_degree']}: peak {r['peak_gib']} GiB, EMA {r['ema_gib']} GiB "
                  f"on {r['device']}")
        name = measured[0]["device"].replace(" ", "_")
        write(measured, args.out_dir, f"zero_memory_measured_{name}")


if __name__ == "__main__":
    main()
