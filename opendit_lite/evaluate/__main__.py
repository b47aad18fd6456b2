"""Generate samples over all ranks and score them (FID, Inception Score, precision/recall).

    python -m opendit_lite.evaluate --config configs/demo.yaml eval.reference=ref.npz \\
        eval.inception_path=/models/weights-inception-2015-12-05-6726825d.pth
    torchrun --standalone --nproc_per_node 8 -m opendit_lite.evaluate --config configs/dit_xl2_256.yaml \\
        sample.ckpt=/models/DiT-XL-2-256x256.pt vae.path=/models/sd-vae-ft-ema sample.cfg_scale=1.5 \\
        eval.samples_per_class=50 eval.reference=VIRTUAL_imagenet256_labeled.npz eval.inception_path=...
Score an existing sample file (no generation): eval.samples=<samples.npz>.

Sampling follows ``sample.*`` (checkpoint, sampler, steps, guidance scale, seed, per-rank batch)
and ``sp_size``; ``eval.*`` says how many samples, where they go and what they are scored against.
Writes ``<eval.output_dir>/samples.npz`` (arr_0: uint8 [N, H, W, 3]; labels: [N]) and
``metrics.json``, and prints the metrics. Without ``eval.reference`` only the Inception Score is
computed (and nothing at all without ``eval.inception_path``).
"""

import json
import os
import sys

from opendit_lite.utils.quiet import quiet_third_party_startup

quiet_third_party_startup()  # before colossalai is imported

import torch

from opendit_lite.config import ConfigError, exit_on_config_error, parse_cli
from opendit_lite.evaluate.features import load_inception
from opendit_lite.evaluate.generate import generate_samples
from opendit_lite.evaluate.images import load_images
from opendit_lite.evaluate.metrics import score_images
from opendit_lite.evaluate.reference import load_reference
from opendit_lite.sampling import sampling_ranks


def check_eval_config(cfg) -> None:
    """What can be checked before sampling starts, so a bad setting does not cost a sampling run."""
    e = cfg.eval
    if e.samples_per_class < 1 or e.batch_size < 1:
        raise ConfigError(f"'eval.samples_per_class' and 'eval.batch_size' must be positive; got "
                          f"{e.samples_per_class} and {e.batch_size}.")
    if e.samples and not os.path.isfile(e.samples):
        raise ConfigError(f"'eval.samples' {e.samples!r} does not exist.")
    if e.reference and not os.path.exists(e.reference):
        raise ConfigError(f"'eval.reference' {e.reference!r} does not exist.")
    if e.precision_recall and not e.reference:
        raise ConfigError("'eval.precision_recall' compares with reference images: set eval.reference.")
    if e.reference or e.inception_path:
        load_inception(e.inception_path, "cpu")  # exits with where to put the weights


def score(cfg, samples_path: str, out_dir: str) -> dict:
    e = cfg.eval
    if not (e.reference or e.inception_path):
        print(f"wrote {samples_path}; set eval.reference and eval.inception_path to score it")
        return {}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    feature_fn = load_inception(e.inception_path, device)
    reference = None
    if e.reference:
        reference = load_reference(e.reference, feature_fn, e.batch_size, need_features=e.precision_recall,
                                   progress=True)
    metrics = score_images(load_images(samples_path), reference, feature_fn, e.batch_size,
                           precision_recall=e.precision_recall, progress=True)
    metrics.update(samples=samples_path, reference=e.reference)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(json.dumps(metrics))
    return metrics


@exit_on_config_error
def main(argv=None) -> dict:
    cfg = parse_cli(sys.argv[1:] if argv is None else argv, __doc__)
    check_eval_config(cfg)
    out_dir = cfg.eval.output_dir or os.path.join(cfg.results_dir, cfg.exp_name, "eval")
    samples = cfg.eval.samples
    if not samples:
        with sampling_ranks(cfg.sp_size) as ranks:
            samples = generate_samples(cfg, ranks, out_dir, save_png=cfg.eval.save_png)
            if not ranks.is_main:
                return {}
    return score(cfg, samples, out_dir)


if __name__ == "__main__":
    main()
