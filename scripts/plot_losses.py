"""Plot logged losses of training runs from their metrics.jsonl files into one PNG (matplotlib).

    python scripts/plot_losses.py outputs/demo_distill/metrics.jsonl outputs/demo_distill_1step/metrics.jsonl \\
        --keys loss_critic loss_student --out docs/images/demo_distill_losses.png

One panel per key, one line per file (labelled by its run folder); a run resumed several times logs some
steps more than once: the last record of a step is the one plotted.
"""

import argparse
import json
import os


def read_series(path: str, key: str):
    """(steps, values) of ``key`` in the metrics.jsonl at ``path``, one value per step (the last logged)."""
    by_step = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if key in record:
                by_step[record["step"]] = record[key]
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl files")
    parser.add_argument("--keys", nargs="+", default=["loss"])
    parser.add_argument("--out", required=True, help="PNG path")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.keys), figsize=(4.5 * len(args.keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], args.keys):
        for path in args.metrics:
            steps, values = read_series(path, key)
            ax.plot(steps, values, label=os.path.basename(os.path.dirname(os.path.abspath(path))))
        ax.set_title(key)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
