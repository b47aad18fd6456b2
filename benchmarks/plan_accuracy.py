"""How close the planner's memory model comes to the real peak on a GPU: DiT-XL/2 and STDiT-XL/2,
bf16, one training step (forward, backward, optimizer step, EMA update) at several buckets, world
size 1, against ``torch.cuda.max_memory_allocated`` over the second step (the steady state: the first
step's peak lacks Adam's moments, created in its optimizer step), counted from what was allocated
before the case was built.

    python benchmarks/plan_accuracy.py                   # every case below
    python benchmarks/plan_accuracy.py --models DiT-XL/2 --zero-degree 2
    python benchmarks/plan_accuracy.py --families        # a Wan-1.3B-like diffusers transformer

For each (model, bucket, batch) the table has the predicted and measured peak (GiB) and their
ratio; the activation part alone is measured as the allocation growth over the forward pass
(peak during forward minus memory before it). The predicted peak is the planner's: model states
and EMA shard (ZeRO formulas) plus saved activations (``opendit_lite/plan/memory_model.py``); the
planner's reserve (10% + 1 GiB) is not part of the prediction. Results: CSV and Markdown under
benchmarks/results/plan_accuracy_<device>.*; the README quotes them. ``--families``: a diffusers
transformer's activations as the planner counts them (on the meta device) against its forward's
allocation growth (benchmarks/results/plan_accuracy_families_<device>.*).
"""

import argparse
import gc
import os
import sys
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # the repository root, and benchmarks/ for zero_memory
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
    from opendit_lite.distributed.process_group import init_distributed
    from opendit_lite.models import build_model
    from opendit_lite.plugins import OpenDiTPlugin

    init_distributed()
    gc.collect()  # the previous case's wrappers, EMA and optimizer hold each other in cycles
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()  # what is left of earlier cases: not this step's
    video = name.startswith("STDiT")
    kwargs = dict(caption_channels=4096, model_max_length=120) if video else dict(input_size=(height, width),
                                                                                  variable_size=True)
    with torch.device("cuda"):  # random init on the GPU: seconds instead of a host-side init of 675M weights
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

    # The second step is measured: the first creates Adam's moments only in its optimizer step, after
    # the activations are gone, so its peak lacks the 8 bytes per parameter every later step holds.
    for measured_step in (False, True):
        if measured_step:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        loss = rf.training_losses(model, x, model_kwargs=kwargs)["loss"].mean()
        torch.cuda.synchronize()
        forward_growth = torch.cuda.max_memory_allocated() - before if measured_step else None
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        plugin.update_ema(model, optimizer)
        torch.cuda.synchronize()
        del loss
    peak = torch.cuda.max_memory_allocated() - baseline
    predicted_act = activation_bytes(shape, frames, height, width, batch, 2,
                                     caption_tokens=120 if video else 0)
    predicted = step_bytes(shape, zero_degree, 1) + predicted_act
    row = {"model": name, "latent": f"{frames}x{height}x{width}", "batch": batch, "zero_degree": zero_degree,
           "predicted_gib": round(predicted / GiB, 2), "measured_peak_gib": round(peak / GiB, 2),
           "ratio": round(predicted / peak, 3), "predicted_act_gib": round(predicted_act / GiB, 2),
           "measured_forward_growth_gib": round(forward_growth / GiB, 2),
           "act_ratio": round(predicted_act / max(forward_growth, 1), 3), "device": torch.cuda.get_device_name()}
    del model, optimizer, plugin, booster
    gc.collect()
    torch.cuda.empty_cache()
    return row


# Diffusers families (--families): a Wan-1.3B-like transformer (Wan 2.1 1.3B's sizes), its activation
# profile counted on the meta device (``plan/activation_count.py``), against the forward's allocation growth
# in bf16 at two buckets of 480x832-like latents: (name, class, config, latent frames, height, width, batch,
# caption tokens).
WAN_1_3B = dict(patch_size=[1, 2, 2], num_attention_heads=12, attention_head_dim=128, in_channels=16,
                out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6)
FAMILY_CASES = [
    ("Wan-1.3B-like", "WanTransformer3DModel", WAN_1_3B, 21, 30, 52, 1, 512),
    ("Wan-1.3B-like", "WanTransformer3DModel", WAN_1_3B, 9, 60, 104, 1, 512),
]


def measure_family(name: str, cls_name: str, config: Dict, frames: int, height: int, width: int, batch: int,
                   caption: int, device: str = "cuda") -> Dict:
    """Predicted saved activations of one forward against what it costs: on CUDA (bf16) the allocation
    growth over the forward, on CPU (fp32) the bytes autograd saves (every saved storage once)."""
    import diffusers
    import torch

    from opendit_lite.families import FamilyDenoiser, family_adapter
    from opendit_lite.plan import family_shape

    cls = getattr(diffusers, cls_name)
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    with torch.device("meta"):
        shape = family_shape(cls(**config), caption, name, dtype=dtype)  # counted in the dtype it runs in
    with torch.device(device):  # random init where it runs: a 1.3B model initialises in seconds on a GPU
        model = cls(**config)
    model = model.to(dtype).train()
    adapter = family_adapter(model)
    width_text = adapter.text_width(model.config)
    denoiser = FamilyDenoiser(adapter, model, model.config, caption, width_text)
    x = torch.randn(batch, adapter.latent_channels(model.config), frames, height, width, device=device, dtype=dtype)
    y = torch.randn(batch, caption, width_text, device=device, dtype=dtype)
    mask = torch.ones(batch, caption, dtype=torch.bool, device=device)
    t = torch.rand(batch, device=device) * 999
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = denoiser(x, t, y, mask)
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - before
        label = torch.cuda.get_device_name()
    else:
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        seen = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage._cdata not in params:
                seen[storage._cdata] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = denoiser(x, t, y, mask)
        measured, label = sum(seen.values()), "cpu"
    predicted = activation_bytes(shape, frames, height, width, batch, 2 if cuda else 4, caption_tokens=caption)
    del out, model
    return {"model": name, "latent": f"{frames}x{height}x{width}", "batch": batch, "caption": caption,
            "predicted_act_gib": round(predicted / GiB, 3), "measured_gib": round(measured / GiB, 3),
            "act_ratio": round(predicted / max(measured, 1), 3), "device": label}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["DiT-XL/2", "STDiT-XL/2"])
    p.add_argument("--zero-degree", type=int, default=2)
    p.add_argument("--families", action="store_true",
                   help="measure the diffusers families' counted activations instead (FAMILY_CASES; needs diffusers)")
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("plan_accuracy.py measures GPU memory: it needs CUDA (the CPU check is "
                         "tests/plan/test_memory_model.py)")
    rows: List[Dict] = []
    if args.families:
        for case in FAMILY_CASES:
            rows.append(measure_family(*case))
            r = rows[-1]
            print(f"{r['model']:<14} {r['latent']:>10} x{r['batch']}: activations predicted "
                  f"{r['predicted_act_gib']:.2f} GiB, forward growth {r['measured_gib']:.2f} GiB "
                  f"(ratio {r['act_ratio']:.3f})")
        write(rows, args.out_dir, f"plan_accuracy_families_{rows[0]['device'].replace(' ', '_')}")
        return
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
