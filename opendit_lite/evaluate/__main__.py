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
computed; ``eval.score=false`` only writes the samples. The Inception weights (their sha256 and
their features) and the reference and samples files are checked before anything is sampled.
"""

import os

from opendit_lite.utils.exit_codes import exit_at_once_on_stop_signals, heavy_imports, script_main

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

from opendit_lite.utils.quiet import quiet_third_party_startup  # noqa: E402

quiet_third_party_startup()  # before colossalai is imported

# No torch below: a config error ends before the seconds of importing torch, timm and Colossal-AI.
from opendit_lite.config import parse_cli  # noqa: E402
from opendit_lite.evaluate.settings import check_eval_settings  # noqa: E402


@script_main
def main(argv) -> dict:
    cfg = parse_cli(argv, __doc__)
    check_eval_settings(cfg)
    with heavy_imports():
        from opendit_lite.evaluate.generate import generate_samples
        from opendit_lite.evaluate.run import check_eval_config, score
        from opendit_lite.sampling import sampling_ranks
    check_eval_config(cfg)
    out_dir = cfg.eval.output_dir or os.path.join(cfg.results_dir, cfg.exp_name, "eval")
    samples = cfg.eval.samples
    if not samples:
        with sampling_ranks(cfg.sp_size, cfg.sample.cfg_parallel) as ranks:
            samples = generate_samples(cfg, ranks, out_dir, save_png=cfg.eval.save_png)
            if not ranks.is_main:
                return {}
    return score(cfg, samples, out_dir)


if __name__ == "__main__":
    main()
