"""Peak memory and step time of a Wan-14B-shaped LoRA step with and without block swapping and an FP8
base, against the planner's prediction (issue "fine-tune 12-14B models on one 24 GB GPU", item 5).

    python benchmarks/memory_24gb.py                              # Wan 2.1 14B shapes, 480p x 81 frames
    python benchmarks/memory_24gb.py --layers 8 --steps 2         # a quicker look: 8 of the 40 blocks

CUDA only (exits with 2 elsewhere). The model is the released Wan2.1-T2V-14B transformer config (the
Wan family's record, ``opendit_lite/families/wan/__init__.py``) with random bf16 weights (no download),
LoRA rank 32 on the family's usual layers, every block checkpointed (``--selective-ratio``), optionally the checkpointed
inputs offloaded (``--ac-offload``), trained through the booster with ZeRO-2 on one GPU (bf16 working
weights, fp32 master copies of the adapters) on one clip of ``--frames`` x ``--height`` x ``--width``
latents (21 x 60 x 104: 81 frames at 480 x 832) and 512 caption tokens. For each combination of
``--swap`` and ``--base-precision`` it measures the peak allocated memory (``max_memory_allocated``:
no CUDA context, no fragmentation) and the median step time over ``--steps`` steps after one warm-up
step, and prints the planner's predicted peak for the same settings (weights, adapter states and the
activations of one sample; the planner adds its reserve on top when it sizes a device).

Targets: fits 24 GB (measured peak + ~1.5 GB context and fragmentation under 24 GiB) with at most 25%
step-time overhead from swapping 16 of 40 blocks; planner within 10% of the measured peak. Results:
a CSV (``--out``; default benchmarks/results/memory_24gb_<date>.csv), one row per combination written
the moment it is measured (device, torch version, commit), so a run cut short keeps what it measured;
a combination that fails (out of memory) gets a row with its error and the run goes on.
"""

import argparse
import csv
import datetime
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from opendit_lite.utils.quiet import quiet_third_party_startup  # noqa: E402

quiet_third_party_startup()
import torch  # noqa: E402

CAPTION_TOKENS = 512
_SHAPES = {}  # layers -> (meta model with LoRA, its ModelShape)


def wan_config(layers: int) -> dict:
    from opendit_lite.families import find_family

    release = next(r for r in find_family("wan").releases if r.name == "Wan2.1-T2V-14B-Diffusers")
    return dict(release.config, num_layers=layers)


def build(layers: int, rank: int):
    """The Wan 14B transformer (``layers`` blocks) with random bf16 weights in host memory, and LoRA."""
    import diffusers

    from opendit_lite.models.lora import apply_lora

    with torch.device("meta"):
        model = diffusers.WanTransformer3DModel(**wan_config(layers)).to(torch.bfloat16)
    model = model.to_empty(device="cpu")
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # drawn on the GPU: fast for 14B weights
            p.copy_(torch.randn(p.shape, device="cuda", generator=g).mul_(0.02))
        for b in model.buffers():
            b.zero_()
    apply_lora(model, rank=rank, alpha=rank, dropout=0.0)
    return model.train()


def predicted_gib(args, swap: int, precision: str) -> float:
    """The planner's peak for these settings: weights + adapter states + one sample's activations."""
    import diffusers

    from opendit_lite.models.lora import apply_lora
    from opendit_lite.plan import Costs, LatentBucket, Setting, Speed, WeightShape, family_shape, plan
    from opendit_lite.plan.memory_model import sample_tokens

    if args.layers not in _SHAPES:  # counted once per depth: two meta forwards
        with torch.device("meta"):
            meta = diffusers.WanTransformer3DModel(**wan_config(args.layers))
            apply_lora(meta, rank=args.rank, alpha=args.rank, dropout=0.0)
        _SHAPES[args.layers] = meta, family_shape(meta, CAPTION_TOKENS, "WanTransformer3DModel",
                                                        dtype=torch.bfloat16)  # counted in the dtype it runs in
    meta, shape = _SHAPES[args.layers]
    bucket = LatentBucket("bench", args.frames, args.height, args.width)
    costs = Costs(shape, WeightShape.of(meta), 1, 2, sample_tokens(shape, args.frames, args.height, args.width),
                  Speed(), (bucket,), CAPTION_TOKENS, ema=False)
    setting = Setting(2, 1, args.selective_ratio, args.ac_offload, swap, precision)
    result = plan(shape, [bucket], 10_000, 1, element_bytes=2, caption_tokens=CAPTION_TOKENS, reserve_gib=0,
                  max_batch=1, settings=[setting], states=costs.states, extra_cost=costs.extra_cost)
    return result.states_gib + result.activation_gib_per_sample["bench"]


def measure(args, swap: int, precision: str) -> dict:
    import gc

    from colossalai.booster import Booster

    from opendit_lite.activation_checkpointing import apply_activation_checkpointing
    from opendit_lite.memory import apply_base_precision, apply_block_swap
    from opendit_lite.plan.memory_model import GiB
    from opendit_lite.plugins import OpenDiTPlugin

    gc.collect()
    torch.cuda.empty_cache()
    predicted = predicted_gib(args, swap, precision)
    model = build(args.layers, args.rank)
    apply_base_precision(model, precision)
    report = apply_block_swap(model, swap)
    if args.selective_ratio < 1:
        apply_activation_checkpointing(model, args.selective_ratio, offload=args.ac_offload)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    plugin = OpenDiTPlugin(zero_degree=2, precision="bf16")
    optimizer = plugin.build_optimizer([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model, optimizer)
    x = torch.randn(1, 16, args.frames, args.height, args.width, device="cuda", dtype=torch.bfloat16)
    text = torch.randn(1, CAPTION_TOKENS, 4096, device="cuda", dtype=torch.bfloat16)
    t = torch.tensor([500.0], device="cuda")
    times = []
    for i in range(args.steps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = boosted(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        booster.backward(out.float().square().mean(), optimizer)
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() - base) / GiB
    fetches = report.swapper.counts.fetches if report.swapper is not None else 0
    del boosted, optimizer, model, out, booster, plugin
    return {"peak_gib": round(peak, 2), "predicted_gib": round(predicted, 2),
            "error_pct": round(100 * (predicted - peak) / peak, 1), "step_s": round(statistics.median(times), 3),
            "fetches": fetches}


FIELDS = ("layers", "frames", "height", "width", "swap", "base_precision", "peak_gib", "predicted_gib", "error_pct",
          "step_s", "fetches", "error", "device", "torch", "commit")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=40, help="blocks of the 40-block Wan 14B to build")
    p.add_argument("--frames", type=int, default=21, help="latent frames (21: 81 video frames)")
    p.add_argument("--height", type=int, default=60, help="latent height (60: 480 pixels)")
    p.add_argument("--width", type=int, default=104, help="latent width (104: 832 pixels)")
    p.add_argument("--rank", type=int, default=32, help="LoRA rank")
    p.add_argument("--swap", type=int, nargs="+", default=[0, 16], help="blocks_to_swap values to measure")
    p.add_argument("--base-precision", nargs="+", default=["none", "fp8"], help="base precisions to measure")
    p.add_argument("--selective-ratio", type=float, default=0.0, help="fraction of blocks not checkpointed")
    p.add_argument("--ac-offload", action="store_true", help="offload the checkpointed blocks' inputs")
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 f"memory_24gb_{datetime.date.today()}.csv"),
                   help="CSV file, one row written per measured combination")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks/memory_24gb.py measures GPU memory and needs a CUDA device; none is visible.",
              file=sys.stderr)
        return 2
    from common import git_commit  # benchmarks/common.py

    from opendit_lite.distributed.process_group import init_distributed

    init_distributed()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    same = dict(layers=args.layers, frames=args.frames, height=args.height, width=args.width,
                device=torch.cuda.get_device_name(), torch=torch.__version__, commit=git_commit())
    rows = []
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        f.flush()
        for precision in args.base_precision:
            for swap in args.swap:
                if swap > args.layers:
                    continue
                row = dict(same, swap=swap, base_precision=precision)
                try:
                    row.update(measure(args, swap, precision))
                except torch.cuda.OutOfMemoryError as e:  # the combination does not fit: said, and the run goes on
                    row["error"] = f"out of memory: {str(e).splitlines()[0]}"
                    torch.cuda.empty_cache()
                rows.append(row)
                writer.writerow(row)
                f.flush()
                print(row, flush=True)
    measured = [r for r in rows if "step_s" in r]
    plain = next((r for r in measured if r["swap"] == 0 and r["base_precision"] == "none"), None)
    print(f"\n{'swap':>5} {'base':>5} {'peak GiB':>9} {'planner GiB':>12} {'error':>7} {'step s':>8} {'overhead':>9}")
    for r in measured:
        overhead = f"{100 * (r['step_s'] / plain['step_s'] - 1):+.1f}%" if plain else "-"
        print(f"{r['swap']:>5} {r['base_precision']:>5} {r['peak_gib']:>9.2f} {r['predicted_gib']:>12.2f} "
              f"{r['error_pct']:>6.1f}% {r['step_s']:>8.3f} {overhead:>9}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
