"""Bytes one GPU sends for sequence parallelism, per layer and per training step (forward + backward),
for the model zoo's shapes under ulysses, ring, usp and dsp at SP sizes 2, 4 and 8, from the formulas
of ``opendit_lite/parallel/comm_volume.py`` (checked against the bytes the real ops send on gloo by
``tests/parallel/test_comm_volume.py``) and the mode ``sp_mode: auto`` picks (``opendit_lite/parallel/
modes.py``, default ``Links``) with the SP group inside one node, and split over two nodes (half of its
ranks on each). Nothing here needs a GPU.

    python benchmarks/sp_comm_volume.py                  # bf16, one sample per GPU
    python benchmarks/sp_comm_volume.py --batch 4 --bytes 4

Writes benchmarks/results/sp_comm_volume.{csv,md} (and .png with matplotlib).
"""

import argparse
import dataclasses
import os
import sys
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # the repository root, and benchmarks/ for zero_memory
from zero_memory import write  # noqa: E402

from opendit_lite.parallel.comm_volume import SPWorkload, layer_traffic, step_traffic  # noqa: E402
from opendit_lite.parallel.modes import Links, decide_sp_mode, mode_candidates  # noqa: E402

SP_SIZES = (2, 4, 8)
MiB = 2 ** 20

# (workload, modes the model declares). Latents: SD-VAE (8x) for the zoo, Wan's VAE (8x, 4x in time)
# for Wan; 2x2 patches. STDiT/Vchitect attend per frame (S tokens x T frames); DiT and Wan over all tokens.
SHAPES: List[Tuple[SPWorkload, Tuple[str, ...]]] = [
    (SPWorkload("DiT-XL/2 256px", tokens=16 * 16, hidden=1152, heads=(16,), layers=28), ("ulysses", "ring", "usp")),
    (SPWorkload("DiT-XL/2 512px", tokens=32 * 32, hidden=1152, heads=(16,), layers=28), ("ulysses", "ring", "usp")),
    (SPWorkload("STDiT-XL/2 16x256x256", tokens=16 * 16, hidden=1152, heads=(16,), layers=28, sequences=16, frames=16),
     ("ulysses", "ring", "usp", "dsp")),
    (SPWorkload("Vchitect-XL 16x256x256", tokens=16 * 16, hidden=1536, heads=(24,), layers=20, sequences=16,
                text_tokens=120, text_query_layers=19), ("ulysses", "ring", "usp")),
    (SPWorkload("Wan-1.3B-like 81x480x832", tokens=21 * 30 * 52, hidden=1536, heads=(12,), layers=30),
     ("ulysses", "ring", "usp")),
    # A head count no SP size shares a divisor with: only the ring runs.
    (SPWorkload("3 heads, 32k tokens", tokens=32768, hidden=384, heads=(3,), layers=12), ("ulysses", "ring", "usp")),
]


def rows(batch: int, element_bytes: int, links: Links) -> List[Dict]:
    out = []
    for w, supported in SHAPES:
        heads = {"attention": w.heads[0]}
        for p in SP_SIZES:
            two_nodes = dataclasses.replace(links, ranks_per_node=max(1, p // 2))
            wins = {"intra": decide_sp_mode(heads, p, supported, w, links, False).describe(p),
                    "inter": decide_sp_mode(heads, p, supported, w, two_nodes, True).describe(p)}
            for mode, ring in mode_candidates(heads, p, supported, w):
                layer = layer_traffic(w, mode, p, ring, element_bytes, batch)
                step = step_traffic(w, mode, p, ring, element_bytes, batch)
                out.append({"model": w.name, "tokens": w.tokens * w.sequences, "heads": w.heads[0], "sp_size": p,
                            "mode": mode if mode != "usp" else f"usp r{ring}",
                            "layer_MiB": round(layer.total / MiB, 3),
                            "all_to_all_MiB": round(layer.all_to_all / MiB, 3),
                            "ring_p2p_MiB": round(layer.ring / MiB, 3), "step_MiB": round(step.total / MiB, 1),
                            "auto_one_node": wins["intra"], "auto_two_nodes": wins["inter"]})
    return out


def doc_table(table: List[Dict]) -> List[str]:
    """The tables of docs/sequence_parallel.md: MiB per layer per mode, and auto's choice."""
    head = ["model", "sp_size", "ulysses", "ring", "usp (ring size)", "dsp", "auto, one node", "auto, two nodes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = list(dict.fromkeys((r["model"], r["sp_size"]) for r in table))
    for model, p in keys:
        rows = {r["mode"]: r for r in table if r["model"] == model and r["sp_size"] == p}
        usp = ", ".join(f"{r['layer_MiB']:.3g} (r{m[5:]})" for m, r in rows.items() if m.startswith("usp"))

        def cell(mode):
            return f"{rows[mode]['layer_MiB']:.3g}" if mode in rows else "n/a"

        first = next(iter(rows.values()))
        lines.append("| " + " | ".join([model, str(p), cell("ulysses"), cell("ring"), usp or "n/a", cell("dsp"),
                                        first["auto_one_node"], first["auto_two_nodes"]]) + " |")
    return lines


def plot(table: List[Dict], path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = list(dict.fromkeys(r["model"] for r in table))
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.5), sharey=False)
    for ax, name in zip(axes, names):
        for mode in dict.fromkeys(r["mode"] for r in table if r["model"] == name):
            pts = [(r["sp_size"], r["layer_MiB"]) for r in table if r["model"] == name and r["mode"] == mode]
            ax.plot(*zip(*pts), marker="o", label=mode)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("sp_size")
        ax.set_xticks(SP_SIZES)
        ax.set_ylabel("MiB sent per layer (fwd + bwd)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1, help="samples per GPU micro-batch")
    parser.add_argument("--bytes", type=int, default=2, help="bytes per element (2: bf16/fp16, 4: fp32)")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    table = rows(args.batch, args.bytes, Links())
    write(table, args.out_dir, "sp_comm_volume")
    png = plot(table, os.path.join(args.out_dir, "sp_comm_volume.png"))
    for r in table:
        print(f"{r['model']:<26} P={r['sp_size']} {r['mode']:<8} {r['layer_MiB']:>9.2f} MiB/layer "
              f"{r['step_MiB']:>9.1f} MiB/step   auto: {r['auto_one_node']} (1 node), {r['auto_two_nodes']} (2 nodes)")
    print("\nMiB sent per GPU per layer (forward + backward), as in docs/sequence_parallel.md:\n")
    print("\n".join(doc_table(table)))
    print(f"wrote {os.path.join(args.out_dir, 'sp_comm_volume.csv')}" + (f" and {png}" if png else ""))


if __name__ == "__main__":
    main()
